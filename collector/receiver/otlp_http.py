"""OTLP/HTTP receiver: ``POST /v1/{traces,metrics,logs}`` -> decoded request -> sink.

Accepts ``application/x-protobuf`` and OTLP JSON (``application/json``, with
hex trace/span ids as the OTLP spec writes them), bodies optionally
``Content-Encoding: gzip`` or ``deflate``. A success answers 200 with an empty
Export*ServiceResponse in the request's encoding. Bad input never reaches the
sink and never stops the server: it answers 400 (malformed body), 404
(unknown path), 405 (not POST), 411 (no length), 413 (body, raw or
decompressed, over ``max_body_bytes``) or 415 (unknown content type or
encoding), with a ``google.rpc.Status`` carrying the reason in the request's
encoding (plain text when the content type is unknown).

Threads: served by `HttpEndpoint` (its connection limits, deadlines and 503s; the
`HttpServerSettings` in ``config.server``): each connection's thread calls the sink. The sink
must be thread-safe; if it raises, the request answers 500 and the exception is logged.

Size: one request path: framing, limits, the Collector's status codes and partial success, each step
needing the one before.
"""

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from otel_llm.collector.http_connection import EndpointHandler
from otel_llm.collector.http_endpoint import HttpEndpoint, HttpServerSettings
from otel_llm.collector.pdata import otlp_codec
from otel_llm.collector.pdata.otlp_codec import CONTENT_TYPES, TEXT, PayloadError

logger = logging.getLogger(__name__)

# Larger declared bodies are not drained before answering 413; the connection closes.
_MAX_DRAIN_BYTES = 256 * 1024 * 1024


class Signal(enum.Enum):
    TRACES = "traces"
    METRICS = "metrics"
    LOGS = "logs"


class PartialSuccess(NamedTuple):
    """What a sink could not take of a request: the OTLP ``partial_success`` answer."""

    rejected: int  # spans, data points or log records
    message: str


Sink = Callable[[Signal, bytes], "PartialSuccess | None"]
"""Receives each Export*ServiceRequest as protobuf bytes (OTLP JSON is converted at the
edge); called on request threads. Raises PayloadError for a request it cannot parse."""


class SignalRoute(NamedTuple):
    signal: Signal
    request_type: type[Message]
    response_type: type[Message]
    rejected_field: str  # of the response's partial_success


ROUTES: dict[str, SignalRoute] = {
    "/v1/traces": SignalRoute(
        Signal.TRACES,
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
        "rejected_spans",
    ),
    "/v1/metrics": SignalRoute(
        Signal.METRICS,
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
        "rejected_data_points",
    ),
    "/v1/logs": SignalRoute(
        Signal.LOGS,
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
        "rejected_log_records",
    ),
}


def export_response(route: SignalRoute, result: PartialSuccess | None) -> Message:
    """The Export*ServiceResponse for a sink's result (partial_success set only when it refused some)."""
    response = route.response_type()
    if result is not None and result.rejected:
        setattr(response.partial_success, route.rejected_field, result.rejected)
        response.partial_success.error_message = result.message
    return response


@dataclass(frozen=True)
class OtlpReceiverConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port; read the bound one from OtlpReceiver.endpoint
    max_body_bytes: int = 16 * 1024 * 1024  # applies before and after decompression
    signals: frozenset[Signal] = frozenset(Signal)  # others answer 404
    server: HttpServerSettings = field(default_factory=HttpServerSettings)  # connections, deadlines

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("OtlpReceiverConfig.host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"OtlpReceiverConfig.port must be in 0..65535, got {self.port!r}")
        if self.max_body_bytes <= 0:
            raise ValueError(
                f"OtlpReceiverConfig.max_body_bytes must be > 0, got {self.max_body_bytes!r}"
            )


class ReceiverStats(NamedTuple):
    accepted: int  # requests handed to the sink
    rejected: int  # answered 4xx
    failed: int  # the sink raised (500)
    refused_connections: int = 0  # beyond the server's max_connections: answered 503 and closed


class OtlpReceiver:
    """Serves OTLP/HTTP on ``config.host:config.port`` until stopped.

    Use as a context manager or call ``start()`` / ``stop()``.
    """

    def __init__(self, sink: Sink, config: OtlpReceiverConfig | None = None) -> None:
        self.sink = sink
        self.config = config = config or OtlpReceiverConfig()
        self.server = HttpEndpoint(type("_Bound", (_Handler,), {"receiver": self}), config.host, config.port,
                                   "otlp-receiver", config.server)
        self._stats_lock = threading.Lock()
        self._accepted = self._rejected = self._failed = 0
        self._started = False

    @property
    def endpoint(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:4318``; append ``/v1/traces`` etc."""
        if not self._started:
            raise RuntimeError("OtlpReceiver is not started")
        return self.server.base_url

    def start(self) -> None:
        self.server.start()
        self._started = True

    def stop(self) -> None:
        self.server.stop()
        self._started = False

    def __enter__(self) -> "OtlpReceiver":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stats(self) -> ReceiverStats:
        with self._stats_lock:
            return ReceiverStats(self._accepted, self._rejected, self._failed, self.server.stats().refused)

    def _count(self, status: int) -> None:
        with self._stats_lock:
            if status == 200:
                self._accepted += 1
            elif status < 500:
                self._rejected += 1
            else:
                self._failed += 1


class _ClientGone(Exception):
    pass


class _Handler(EndpointHandler):
    server_version = "otel-llm-otlp"
    receiver: OtlpReceiver

    def do_POST(self) -> None:
        content_type = otlp_codec.media_type(self.headers.get("Content-Type", ""))
        try:
            status, body = self._export(content_type)
        except _ClientGone:
            # It missed its body deadline or disconnected: nobody to answer.
            logger.debug("OTLP client %s gone mid-body", self.address_string(), exc_info=True)
            self.close_connection = True
            return
        except PayloadError as rej:
            status, body = rej.status, otlp_codec.error_body(rej.status, rej.reason, content_type)
        except Exception:
            logger.exception("OTLP export request to %s failed", self.path)
            status = 500
            body = otlp_codec.error_body(500, "internal error in the receiver's sink", content_type)
        self.receiver._count(status)
        self._respond(status, content_type, body)

    def _export(self, content_type: str) -> tuple[int, bytes]:
        route = ROUTES.get(self.path.split("?", 1)[0])
        accepted = self.receiver.config.signals
        if route is None or route.signal not in accepted:
            self.close_connection = True  # the body stays unread
            paths = " or ".join(p for p, r in ROUTES.items() if r.signal in accepted)
            raise PayloadError(404, f"unknown path {self.path!r}; use {paths}")
        if content_type not in CONTENT_TYPES:
            self.close_connection = True
            raise PayloadError(
                415,
                f"unsupported Content-Type {self.headers.get('Content-Type')!r}; "
                f"use {' or '.join(CONTENT_TYPES)}",
            )
        try:
            raw = self._read_body()
        except OSError as exc:
            raise _ClientGone from exc
        payload = otlp_codec.decompress(raw, self.headers.get("Content-Encoding", ""), self._limit)
        if content_type != otlp_codec.PROTOBUF:
            payload = otlp_codec.decode(payload, content_type, route.request_type).SerializeToString()
        result = self.receiver.sink(route.signal, payload)
        return 200, otlp_codec.encode(export_response(route, result), content_type)

    @property
    def _limit(self) -> int:
        return self.receiver.config.max_body_bytes

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            raise PayloadError(411, "Content-Length or chunked Transfer-Encoding required")
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise PayloadError(400, f"invalid Content-Length {length_header!r}") from None
        if length > self._limit:
            self.discard(_MAX_DRAIN_BYTES)  # so the client reads the 413, not a reset
            raise PayloadError(
                413, f"body of {length} bytes exceeds the limit of {self._limit} bytes"
            )
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            raise PayloadError(400, f"body ended after {len(body)} of {length} bytes")
        return body

    def _read_chunked(self) -> bytes:
        chunks, total = [], 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise PayloadError(400, f"invalid chunk size line {line[:40]!r}") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > self._limit:
                self.close_connection = True
                raise PayloadError(413, f"chunked body exceeds the limit of {self._limit} bytes")
            chunks.append(self.rfile.read(size))
            self.rfile.readline(1024)

    def _respond(self, status: int, content_type: str, body: bytes) -> None:
        self.send(status, content_type if content_type in CONTENT_TYPES else TEXT, body,
                  (("Allow", "POST"),) if status == 405 else ())

    def deny(self, status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        content_type = otlp_codec.media_type(self.headers.get("Content-Type", ""))
        self.send(status, content_type if content_type in CONTENT_TYPES else TEXT,
                  otlp_codec.error_body(status, reason, content_type), headers)

    def _reject_method(self) -> None:
        content_type = otlp_codec.media_type(self.headers.get("Content-Type", ""))
        self.close_connection = True
        if self.path.split("?", 1)[0] in ROUTES:
            status, reason = 405, f"{self.command} not allowed; use POST"
        else:
            status, reason = 404, f"unknown path {self.path!r}"
        self.receiver._count(status)
        self._respond(status, content_type, otlp_codec.error_body(status, reason, content_type))

    do_GET = do_PUT = do_DELETE = do_PATCH = _reject_method


__all__ = [
    "OtlpReceiver",
    "OtlpReceiverConfig",
    "PartialSuccess",
    "ReceiverStats",
    "Signal",
    "Sink",
]
