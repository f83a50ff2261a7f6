"""Server-side TLS for every listener: `--tls-cert-file`, `--tls-key-file` and, for mutual TLS,
`--tls-client-ca-file` (the OpenTelemetry Collector's ``tls.cert_file``, ``key_file`` and
``client_ca_file``).

The files are read once, at start-up: a missing file, a key that does not match its
certificate, or a CA file that is not PEM fails there, naming the flag.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None  # set: clients must present a certificate it signed

    def server_context(self) -> ssl.SSLContext:
        """The listeners' context (TLS 1.2 and later). Raises ValueError naming the bad file."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--tls-cert-file {self.cert_file} / --tls-key-file {self.key_file}: "
                             f"{_reason(exc)}") from None
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--tls-client-ca-file {self.client_ca_file}: {_reason(exc)}") from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def grpc_credentials(self):
        """The same files as gRPC server credentials."""
        import grpc

        self.server_context()  # the same checks, the same messages
        with open(self.key_file, "rb") as key, open(self.cert_file, "rb") as cert:
            pair = (key.read(), cert.read())
        ca = None
        if self.client_ca_file is not None:
            with open(self.client_ca_file, "rb") as f:
                ca = f.read()
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)
