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
    protocol = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol == "grpc":
        exporter = grpc()
        return exporter(endpoint=endpoint, insecure=True) if endpoint else exporter()
    if protocol != "http/protobuf":
        raise ValueError(f"unsupported OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} (use grpc or http/protobuf)")
    exporter = http()
    path = f"/v1/{signal}"
    if endpoint and not endpoint.rstrip("/").endswith(path):
        endpoint = endpoint.rstrip("/") + path
    return exporter(endpoint=endpoint) if endpoint else exporter()


def otlp_destination(signal: str, endpoint: str | None = None) -> str:
    """Where `otlp_exporter(signal, endpoint, ...)` sends, as it may be shown (credentials redacted):
    the protocol and the URL, from `endpoint` or the environment as the SDK's exporters read it
    (OTEL_EXPORTER_OTLP_{SIGNAL}_ENDPOINT as is; OTEL_EXPORTER_OTLP_ENDPOINT, plus `/v1/{signal}`
    over HTTP; else localhost:4318 over HTTP, localhost:4317 over gRPC)."""
    protocol = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    grpc = protocol == "grpc"
    url = endpoint or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    if not url:
        base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or ("http://localhost:4317" if grpc
                                                                  else "http://localhost:4318")
        url = base if grpc else base.rstrip("/") + f"/v1/{signal}"
    elif not grpc and endpoint and not url.rstrip("/").endswith(f"/v1/{signal}"):
        url = url.rstrip("/") + f"/v1/{signal}"
    return f"{redact_url(url)} ({protocol})"
