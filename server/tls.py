"""`TlsConfig`: the server's certificate and key, and the client CA that makes it mutual TLS.

`otel-llm serve --tls-cert-file --tls-key-file [--tls-client-ca-file]` builds one (`tls_config`);
uvicorn loads the same files (`uvicorn_kwargs`). The files are loaded once at construction, so a
missing file, a PEM that is no certificate or a key that does not match fails at startup, naming
the flag, instead of in uvicorn's startup with a traceback. The key must not be encrypted.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class TlsConfig:
    """PEM file paths. `client_ca_file`: clients must present a certificate signed by it (mTLS);
    None: any client may connect (server-side TLS only)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def __post_init__(self) -> None:
        for flag, path in (("cert", self.cert_file), ("key", self.key_file), ("client-ca", self.client_ca_file)):
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"--tls-{flag}-file {path!r}: no such file")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
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
    """The flags' `TlsConfig`; None without them. Raises ValueError naming the flag missing or wrong."""
    if cert_file is None and key_file is None:
        if client_ca_file is not None:
            raise ValueError(f"--tls-client-ca-file {client_ca_file!r}: needs --tls-cert-file and --tls-key-file")
        return None
    if cert_file is None or key_file is None:
        given, missing = ("cert", "key") if key_file is None else ("key", "cert")
        raise ValueError(f"--tls-{given}-file needs --tls-{missing}-file")
    return TlsConfig(cert_file, key_file, client_ca_file)
