"""OTLP/gRPC receiver: the ``Export`` RPC of the trace, metrics and logs services -> sink.

The same sink as the HTTP receiver (`otlp_receiver.Sink`) gets the request's
protobuf bytes: the RPCs are registered with a raw-bytes deserializer, so the
sink parses once (the metric store with its fast view) and a malformed message
answers ``INVALID_ARGUMENT`` with the parse error instead of gRPC's generic
``INTERNAL``. A sink that refuses part of a request answers with
``partial_success``; one that raises answers ``INTERNAL`` and is logged.
Messages over ``max_message_bytes`` are refused by gRPC (``RESOURCE_EXHAUSTED``). With `tls`,
the port is a TLS one (mutual with a client CA); with `auth`, a call without the credentials in
its ``authorization`` metadata answers ``UNAUTHENTICATED``.

Threads: gRPC's server pool (``max_workers``) calls the sink concurrently.
"""

from __future__ import annotations

import logging
from concurrent import futures
from dataclasses import dataclass

import grpc

from otel_llm.cli.tls import TlsConfig
from otel_llm.collector.extension.auth import Authenticator
from otel_llm.collector.pdata.otlp_codec import PayloadError
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
    max_workers: int = 4
    signals: frozenset[Signal] = frozenset(Signal)  # others answer UNIMPLEMENTED
    tls: TlsConfig | None = None
    auth: Authenticator | None = None

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("OtlpGrpcReceiverConfig.host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"OtlpGrpcReceiverConfig.port must be in 0..65535, got {self.port!r}")
        if self.max_message_bytes <= 0:
            raise ValueError(f"OtlpGrpcReceiverConfig.max_message_bytes must be > 0, got {self.max_message_bytes!r}")
        if self.max_workers < 1:
            raise ValueError(f"OtlpGrpcReceiverConfig.max_workers must be >= 1, got {self.max_workers!r}")


class OtlpGrpcReceiver:
    """Serves OTLP/gRPC on ``config.host:config.port`` until stopped."""

    def __init__(self, sink: Sink, config: OtlpGrpcReceiverConfig | None = None) -> None:
        self.sink = sink
        self.config = config or OtlpGrpcReceiverConfig()
        self._server: grpc.Server | None = None
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
        limit = self.config.max_message_bytes
        interceptors = () if self.config.auth is None else (_AuthInterceptor(self.config.auth),)
        server = grpc.server(futures.ThreadPoolExecutor(self.config.max_workers, thread_name_prefix="otlp-grpc"),
                             options=[("grpc.max_receive_message_length", limit)], interceptors=interceptors)
        for route in ROUTES.values():
            if route.signal in self.config.signals:
                handler = grpc.unary_unary_rpc_method_handler(
                    self._export_handler(route), request_deserializer=None,
                    response_serializer=lambda message: message.SerializeToString())
                server.add_generic_rpc_handlers(
                    (grpc.method_handlers_generic_handler(_SERVICES[route.signal], {"Export": handler}),))
        address = f"{self.config.host}:{self.config.port}"
        tls = self.config.tls
        port = server.add_insecure_port(address) if tls is None else server.add_secure_port(
            address, tls.grpc_credentials())
        if port == 0:
            raise OSError(f"cannot bind OTLP/gRPC to {self.config.host}:{self.config.port}")
        server.start()
        self._server, self.port = server, port

    def _export_handler(self, route: SignalRoute):
        def export(payload: bytes, context: grpc.ServicerContext):
            try:
                result = self.sink(route.signal, payload)
            except PayloadError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.reason)
            except Exception:
                logger.exception("OTLP/gRPC %s export failed in the sink", route.signal.value)
                context.abort(grpc.StatusCode.INTERNAL, "internal error in the receiver's sink")
            return export_response(route, result)

        return export

    def stop(self, grace_s: float = 2.0) -> None:
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None

    def __enter__(self) -> OtlpGrpcReceiver:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


class _AuthInterceptor(grpc.ServerInterceptor):
    """Refuses a call whose ``authorization`` metadata the authenticator does not accept."""

    def __init__(self, auth: Authenticator) -> None:
        self._auth = auth
        self.unauthorized = 0

        def deny(request, context: grpc.ServicerContext):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong credentials")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        metadata = dict(handler_call_details.invocation_metadata or ())
        if self._auth.check(metadata.get("authorization")):
            return continuation(handler_call_details)
        self.unauthorized += 1
        return self._deny
