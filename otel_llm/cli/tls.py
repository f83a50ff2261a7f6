"""`TlsConfig`: a listener's certificate and key, and the client CA that makes it mutual TLS, for
`otel-llm serve` and every `otel-llm collector` listener (the OpenTelemetry Collector's
``tls.cert_file``, ``key_file`` and ``client_ca_file``).

`tls_config` builds one from the `--tls-cert-file`, `--tls-key-file` and `--tls-client-ca-file`
flags and loads the files once, so a missing file, a PEM that is no certificate, a key that is not
the certificate's or an encrypted key fails at start-up, naming the flag. The same files then
serve as an `ssl.SSLContext` (the collector's HTTP listeners), gRPC server credentials, or
uvicorn's arguments (the server).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class TlsConfig:
    """PEM file paths. `client_ca_file`: clients must present a certificate signed by it (mTLS);
    None: any client may connect (server-side TLS only). Nothing is read until a method needs it."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def server_context(self) -> ssl.SSLContext:
        """TLS 1.2 and later with these files. Raises ValueError naming the flag of a bad file."""
        for flag, path in (("cert", self.cert_file), ("key", self.key_file), ("client-ca", self.client_ca_file)):
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"--tls-{flag}-file {path!r}: no such file")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file, password=_no_password)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ValueError(f"--tls-cert-file {self.cert_file!r} with --tls-key-file {self.key_file!r}: not a "
                             f"PEM certificate and its (unencrypted) private key: {exc}") from None
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca_file)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(f"--tls-client-ca-file {self.client_ca_file!r}: not PEM CA certificates: "
                                 f"{exc}") from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def uvicorn_kwargs(self) -> dict:
        """`uvicorn.Config`'s TLS arguments."""
        kwargs = {"ssl_certfile": self.cert_file, "ssl_keyfile": self.key_file}
        if self.client_ca_file is not None:
            kwargs.update(ssl_ca_certs=self.client_ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
        return kwargs


def _no_password() -> bytes:
    """An encrypted key would make OpenSSL prompt on the terminal; it fails instead."""
    raise ValueError("the key is encrypted (a password-protected key is not supported)")


def tls_config(cert_file: str | None, key_file: str | None, client_ca_file: str | None) -> TlsConfig | None:
    """The flags' `TlsConfig`, its files loaded once; None without them. Raises ValueError naming the
    flag missing or wrong."""
    if cert_file is None and key_file is None:
        if client_ca_file is not None:
            raise ValueError(f"--tls-client-ca-file needs --tls-cert-file and --tls-key-file (got {client_ca_file!r})")
        return None
    if cert_file is None or key_file is None:
        given, missing = ("cert", "key") if key_file is None else ("key", "cert")
        raise ValueError(f"--tls-{given}-file needs --tls-{missing}-file "
                         "(--tls-cert-file and --tls-key-file go together)")
    config = TlsConfig(cert_file, key_file, client_ca_file)
    config.server_context()
    return config
