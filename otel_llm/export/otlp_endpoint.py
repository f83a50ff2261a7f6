"""Where and how an OTLP exporter sends: the protocol from the standard OTEL_* environment and the
endpoint as our flags and the environment give it, for spans and metrics alike."""

from __future__ import annotations

import os
from collections.abc import Callable

from otel_llm.export.redaction import redact_url


def otlp_exporter(signal: str, endpoint: str | None, grpc: Callable[[], type], http: Callable[[], type]):
    """An OTLP exporter for `signal` ("traces" or "metrics").

    The protocol is OTEL_EXPORTER_OTLP_{SIGNAL}_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL:
    `http/protobuf` (the default) or `grpc`; ValueError naming any other. `endpoint` is the
    signal's URL for HTTP (`/v1/{signal}` is appended when missing, so a collector's base URL
    works) or `host:port` / `http://host:port` for gRPC (plaintext); None lets the exporter read
    OTEL_EXPORTER_OTLP_({SIGNAL}_)ENDPOINT itself. `grpc` and `http` return the exporter class
    of each protocol, so only the one chosen is imported.
    """
    protocol = _protocol(signal)
    if protocol == "grpc":
        exporter = grpc()
        return exporter(endpoint=endpoint, insecure=True) if endpoint else exporter()
    if protocol != "http/protobuf":
        raise ValueError(f"unsupported OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} (use grpc or http/protobuf)")
    exporter = http()
    return exporter(endpoint=_with_path(endpoint, signal)) if endpoint else exporter()


def otlp_destination(signal: str, endpoint: str | None = None) -> str:
    """Where `otlp_exporter(signal, endpoint, ...)` sends, as it may be shown (credentials redacted):
    the URL and the protocol, from `endpoint` or the environment as the SDK's exporters read it
    (OTEL_EXPORTER_OTLP_{SIGNAL}_ENDPOINT as is; OTEL_EXPORTER_OTLP_ENDPOINT, plus `/v1/{signal}`
    over HTTP; else localhost:4318 over HTTP, localhost:4317 over gRPC)."""
    protocol = _protocol(signal)
    grpc = protocol == "grpc"
    url = endpoint or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    if not url or (endpoint and not grpc):
        base = url or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or f"http://localhost:{4317 if grpc else 4318}"
        url = base if grpc else _with_path(base, signal)
    return f"{redact_url(url)} ({protocol})"


def _protocol(signal: str) -> str:
    return os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")


def _with_path(url: str, signal: str) -> str:
    """An HTTP endpoint with the signal's path (`/v1/traces`), appended when it lacks it."""
    path = f"/v1/{signal}"
    return url if url.rstrip("/").endswith(path) else url.rstrip("/") + path
