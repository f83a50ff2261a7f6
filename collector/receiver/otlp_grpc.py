"""OTLP/gRPC receiver: the ``Export`` RPC of the trace, metrics and logs services -> sink.

The same sink as the HTTP receiver (`otlp_http.Sink`) gets the request's protobuf bytes, so
the sink parses once (the metric store with its fast view) and a malformed message answers
``INVALID_ARGUMENT`` with the parse error. A sink that refuses part of a request answers with
``partial_success``; one that raises answers ``INTERNAL`` and is logged. Messages over
``max_message_bytes`` answer ``RESOURCE_EXHAUSTED``. With the settings' `tls`, the port is a TLS one (mutual
with a client CA); with their `auth`, a call without the credentials in its ``authorization`` metadata
answers ``UNAUTHENTICATED``. Other signals' services answer ``UNIMPLEMENTED``.

The server is `grpc_h2.UnaryServer` (HTTP/2 on asyncio), not grpcio's: a fifth of its CPU per
call (`benchmarks/grpc_server_bench.py`). Its connection bounds are the listener's
`HttpServerSettings` (connections, header, body, idle and write timeouts).

Threads: the server's event loop thread calls the sink, one call at a time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from otel_llm.collector.http_endpoint import HttpServerSettings
from otel_llm.collector.pdata.otlp_codec import PayloadError
from otel_llm.collector.receiver.grpc_h2 import GrpcError, Status, UnaryServer
from otel_llm.collector.receiver.otlp_http import ROUTES, Signal, SignalRoute, Sink, export_response

logger = logging.getLogger(__name__)

_SERVICES = {
    Signal.TRACES: "opentelemetry.proto.collector.trace.v1.TraceService",
    Signal.METRICS: "opentelemetry.proto.collector.metrics.v1.MetricsService",
    Signal.LOGS: "opentelemetry.proto.collector.logs.v1.LogsService",
}


@dataclass(frozen=True)
class OtlpGrpcReceiverConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port; read the bound one from OtlpGrpcReceiver.port
    max_message_bytes: int = 16 * 1024 * 1024
    signals: frozenset[Signal] = frozenset(Signal)  # others answer UNIMPLEMENTED
    server: HttpServerSettings = field(default_factory=HttpServerSettings)  # bounds, TLS and credentials

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("OtlpGrpcReceiverConfig.host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"OtlpGrpcReceiverConfig.port must be in 0..65535, got {self.port!r}")
        if self.max_message_bytes <= 0:
            raise ValueError(f"OtlpGrpcReceiverConfig.max_message_bytes must be > 0, got {self.max_message_bytes!r}")


class OtlpGrpcReceiver:
    """Serves OTLP/gRPC on ``config.host:config.port`` until stopped."""

    def __init__(self, sink: Sink, config: OtlpGrpcReceiverConfig | None = None) -> None:
        self.sink = sink
        self.config = config or OtlpGrpcReceiverConfig()
        self._server: UnaryServer | None = None
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        """``host:port`` as gRPC exporters take it."""
        if self.port is None:
            raise RuntimeError("OtlpGrpcReceiver is not started")
        return f"{self.config.host}:{self.port}"

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("OtlpGrpcReceiver already started")
        config = self.config
        handlers = {f"/{_SERVICES[route.signal]}/Export": self._export_handler(route)
                    for route in ROUTES.values() if route.signal in config.signals}
        server = UnaryServer(handlers, config.host, config.port, settings=config.server,
                             max_message_bytes=config.max_message_bytes, name="otlp-grpc")
        try:
            self.port = server.start()
        except OSError as exc:
            raise OSError(f"cannot bind OTLP/gRPC to {config.host}:{config.port}: {exc}") from None
        self._server = server

    @property
    def unauthorized(self) -> int:
        """Calls refused for missing or wrong credentials."""
        return 0 if self._server is None else self._server.unauthorized

    def _export_handler(self, route: SignalRoute):
        def export(payload: bytes) -> bytes:
            try:
                result = self.sink(route.signal, payload)
            except PayloadError as exc:
                raise GrpcError(Status.INVALID_ARGUMENT, exc.reason) from None
            except Exception:
                logger.exception("OTLP/gRPC %s export failed in the sink", route.signal.value)
                raise GrpcError(Status.INTERNAL, "internal error in the receiver's sink") from None
            return export_response(route, result).SerializeToString()

        return export

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> OtlpGrpcReceiver:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
