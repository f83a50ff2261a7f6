"""OTLP exporter: Export{Trace,Metrics}ServiceRequest bytes -> one backend, over OTLP/HTTP
protobuf (``http(s)://host:port[/path]``, ``/v1/traces`` or ``/v1/metrics`` when no path is
given) or OTLP/gRPC (``grpc://host:port``, plain text); ``signal`` says which.

`export` offers the request as it was received (never decoded again) to this backend's own
`ExporterQueue`; the queue's thread merges the requests waiting behind one into batches of up
to ``max_batch`` spans or points (serialized requests concatenate into one: protobuf appends
their repeated ``resource_spans``/``resource_metrics``) and sends them. What is retried is what the OTLP specification
calls retryable: HTTP 429, 502, 503, 504 (no sooner than ``Retry-After``) and network errors;
gRPC CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS, and
RESOURCE_EXHAUSTED when the server sends a ``RetryInfo`` (its delay is honoured). Anything
else is dropped at once and counted ``send_failed``. With ``storage_dir`` the queue is a SQLite
file (one per backend): what a receiver acknowledged is on disk before the answer goes out
and reaches the backend at least once, across ``kill -9`` and restarts.
"""

from __future__ import annotations

import logging
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.rpc import error_details_pb2, status_pb2

from otel_llm import __version__
from otel_llm.collector.exporter.http_sender import HttpSender, check_headers, check_http_url
from otel_llm.collector.exporter.queue import (
    Batch, ExporterQueue, PermanentError, QueueConfig, QueueStats, RetryableError, RetryConfig,
)
from otel_llm.collector.exporter.queue_storage import SqliteStorage, storage_path

logger = logging.getLogger(__name__)

_SIGNALS = {  # signal -> (HTTP path, gRPC method, the records' unit)
    "traces": ("/v1/traces", "/opentelemetry.proto.collector.trace.v1.TraceService/Export", "spans"),
    "metrics": ("/v1/metrics", "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export", "metric points"),
}
_RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
_RETRYABLE_GRPC = frozenset({
    grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
    grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS,
})
_RESERVED_HEADERS = frozenset({"content-type", "user-agent"})
DISK_QUEUE = QueueConfig(queue_size=1_000_000, max_bytes=4 * 1024**3)  # per backend, with storage_dir


@dataclass(frozen=True)
class OtlpExporterConfig:
    url: str  # http(s)://host:port[/path] or grpc://host:port
    name: str = "otlp"  # id in logs and self-telemetry, e.g. "otlphttp/0"
    timeout_s: float = 10.0  # per send (HTTP: per socket operation; gRPC: the RPC's deadline)
    max_batch: int = 512  # spans or metric points per send (whole requests: one larger one goes alone)
    signal: str = "traces"  # or "metrics"
    queue: QueueConfig = QueueConfig(queue_size=1000, max_bytes=64 * 1024 * 1024)
    retry: RetryConfig = RetryConfig()
    headers: tuple[tuple[str, str], ...] = ()  # extra ones (HTTP headers, gRPC metadata)
    storage_dir: str | None = None  # the queue in a SQLite file there (survives a restart), else in memory

    def __post_init__(self) -> None:
        if isinstance(self.url, str) and self.url.startswith("grpc://"):
            parts = urllib.parse.urlsplit(self.url)
            try:
                port = parts.port
            except ValueError:
                port = None
            if not parts.hostname or port is None or parts.path not in ("", "/"):
                raise ValueError(f"OtlpExporterConfig.url: {self.url!r} is not grpc://host:port")
        else:
            check_http_url(self.url, "OtlpExporterConfig.url (http(s)://host:port[/path] or grpc://host:port)")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise ValueError(f"OtlpExporterConfig.timeout_s must be > 0, got {self.timeout_s!r}")
        if not (isinstance(self.max_batch, int) and self.max_batch >= 1):
            raise ValueError(f"OtlpExporterConfig.max_batch must be an int >= 1, got {self.max_batch!r}")
        if self.signal not in _SIGNALS:
            raise ValueError(f"OtlpExporterConfig.signal must be one of {tuple(_SIGNALS)}, got {self.signal!r}")
        check_headers(self.headers, _RESERVED_HEADERS, "OtlpExporterConfig.headers")

    @property
    def grpc(self) -> bool:
        return self.url.startswith("grpc://")

    @property
    def endpoint(self) -> str:
        """Where requests go: host:port for gRPC, the full URL for HTTP."""
        if self.grpc:
            return self.url.removeprefix("grpc://").rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        return self.url if parts.path not in ("", "/") else self.url.rstrip("/") + _SIGNALS[self.signal][0]


class OtlpExporter:
    """Sends to one backend from its own queue and thread. `export`, `stats` and `stop` may be
    called from any thread."""

    def __init__(self, config: OtlpExporterConfig) -> None:
        self.config = config
        self.name = config.name
        self.data_type = config.signal
        headers = {**dict(config.headers), "User-Agent": f"otel-llm/{__version__}"}
        self._http = None if config.grpc else HttpSender(
            config.endpoint, config.timeout_s, {**headers, "Content-Type": "application/x-protobuf"})
        self._metadata = tuple((k.lower(), v) for k, v in headers.items())
        self._channel: grpc.Channel | None = None
        self._channel_lock = threading.Lock()
        storage = None if config.storage_dir is None else SqliteStorage(
            storage_path(Path(config.storage_dir), config.signal, config.endpoint))
        _, self._method, unit = _SIGNALS[config.signal]
        self._queue: ExporterQueue[bytes] = ExporterQueue(
            self.name, self._send, config.queue, config.retry, unit=unit,
            batch=Batch(config.max_batch, b"".join), storage=storage)

    def start(self) -> None:
        self._queue.start()

    def export(self, request: bytes, records: int) -> None:
        """Queue one serialized request carrying ``records`` spans or points; never blocks, never
        raises. When the queue is full they are counted ``enqueue_failed`` and dropped."""
        self._queue.offer(request, records, len(request))

    def stats(self) -> QueueStats:
        return self._queue.stats()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is queued for up to ``timeout_s``, then drop the rest (counted ``send_failed``)
        and abort a send still in flight."""
        done = self._queue.stop(timeout_s)
        if self._http is not None and not done:
            self._http.abort()
        elif self._http is not None:
            self._http.close()
        with self._channel_lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()  # cancels an RPC in flight

    def _send(self, body: bytes) -> None:
        if self._http is None:
            self._send_grpc(body)
            return
        answer = self._http.post(body)
        if 200 <= answer.status < 300:
            return
        reason = f"HTTP {answer.status} from {self._http.url}: {answer.text()}"
        if answer.status in _RETRYABLE_HTTP:
            raise RetryableError(reason, answer.retry_after_s())
        raise PermanentError(reason)

    def _send_grpc(self, body: bytes) -> None:
        with self._channel_lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(self.config.endpoint)
            export = self._channel.unary_unary(self._method, request_serializer=None, response_deserializer=None)
        try:
            export(body, timeout=self.config.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            reason = f"gRPC {code.name} from {self.config.endpoint}: {exc.details() if hasattr(exc, 'details') else exc}"
            delay = _retry_delay_s(exc)
            if code in _RETRYABLE_GRPC or (code is grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None):
                raise RetryableError(reason, delay) from None
            raise PermanentError(reason) from None


def _retry_delay_s(exc: grpc.RpcError) -> float | None:
    """The ``google.rpc.RetryInfo`` delay in the error's status details, if the server sent one."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == "grpc-status-details-bin":
            try:
                status = status_pb2.Status.FromString(value)
            except Exception:  # a malformed detail is no reason to fail the retry decision
                return None
            for detail in status.details:
                if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    info = error_details_pb2.RetryInfo()
                    detail.Unpack(info)
                    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


__all__ = ["OtlpExporter", "OtlpExporterConfig"]
