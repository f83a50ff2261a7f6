"""Prometheus remote-write 1.0 exporter: `PrwSeries` -> snappy protobuf POSTs to one URL.

`export` splits the series into requests of at most ``max_samples_per_send``
samples, encodes them on the caller's thread (so the queue holds compact
bodies, ~25 bytes a sample) and offers them to its own `ExporterQueue`; it
never blocks and never raises. The queue's thread POSTs them over one
persistent HTTP/1.1 connection with the headers the spec requires. Answers,
as the spec says: 2xx sent; 5xx and network errors retried with backoff; 429
retried no sooner than its ``Retry-After``; any other status dropped at once,
its body logged as it is (truncated).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from otel_llm import __version__
from otel_llm.collector.exporter.http_sender import HttpSender, check_headers, check_http_url
from otel_llm.collector.exporter.queue import (
    ExporterQueue, PermanentError, QueueConfig, QueueStats, RetryableError, RetryConfig,
)
from otel_llm.collector.exporter.remote_write.proto import PrwSeries, encode_write_request

logger = logging.getLogger(__name__)

# The spec forbids letting users override these.
_RESERVED_HEADERS = frozenset({
    "content-encoding", "content-type", "user-agent", "x-prometheus-remote-write-version",
})


@dataclass(frozen=True)
class RemoteWriteConfig:
    url: str  # e.g. http://127.0.0.1:9090/api/v1/write
    timeout_s: float = 5.0  # per socket operation of one POST (connect, send, each read)
    max_samples_per_send: int = 2000
    queue: QueueConfig = QueueConfig()
    retry: RetryConfig = RetryConfig()
    headers: tuple[tuple[str, str], ...] = ()  # extra ones, e.g. (("Authorization", "Bearer x"),)
    name: str = "prometheusremotewrite"  # id in logs and self-telemetry: "prometheusremotewrite/0"

    def __post_init__(self) -> None:
        check_http_url(self.url, "RemoteWriteConfig.url")
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ValueError(f"RemoteWriteConfig.timeout_s must be > 0, got {self.timeout_s!r}")
        n = self.max_samples_per_send
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"RemoteWriteConfig.max_samples_per_send must be an int >= 1, got {n!r}")
        if not isinstance(self.queue, QueueConfig) or not isinstance(self.retry, RetryConfig):
            raise ValueError(f"RemoteWriteConfig.queue/retry must be QueueConfig/RetryConfig, "
                             f"got {self.queue!r} / {self.retry!r}")
        check_headers(self.headers, _RESERVED_HEADERS, "RemoteWriteConfig.headers")
        if not self.name:
            raise ValueError("RemoteWriteConfig.name must not be empty")


class RemoteWriteExporter:
    """Sends to one remote-write URL from its own queue and thread.

    Thread-safety: `export`, `stats` and `stop` may be called from any thread; the
    connection belongs to the queue's thread.
    """

    data_type = "metrics"

    def __init__(self, config: RemoteWriteConfig) -> None:
        self.config = config
        self.name = config.name
        self._http = HttpSender(config.url, config.timeout_s, {
            **dict(config.headers),
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"otel-llm/{__version__}",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        })
        self._queue: ExporterQueue[bytes] = ExporterQueue(self.name, self._send, config.queue, config.retry)

    def start(self) -> None:
        self._queue.start()

    def export(self, series: Sequence[PrwSeries]) -> None:
        """Queue ``series`` for sending; never blocks, never raises. What does not fit in
        the queue (or cannot be encoded) is counted ``enqueue_failed`` and dropped."""
        try:
            self._offer(series)
        except Exception:  # the telemetry path never raises; a bug here must not stop the caller
            logger.exception("%s: export failed", self.name)

    def _offer(self, series: Sequence[PrwSeries]) -> None:
        step = self.config.max_samples_per_send
        for start in range(0, len(series), step):
            chunk = series[start:start + step]
            try:
                body = encode_write_request(chunk)
            except Exception as exc:  # a malformed series (not str labels...): drop this request only
                logger.debug("%s: cannot encode %d samples", self.name, len(chunk), exc_info=True)
                self._queue.reject(len(chunk), f"cannot encode: {type(exc).__name__}: {exc}")
                continue
            if not self._queue.offer(body, len(chunk), len(body)):
                rest = len(series) - start - len(chunk)
                if rest:  # the queue will not have room a moment later: skip encoding the rest
                    self._queue.reject(rest, "sending queue full")
                return

    def stats(self) -> QueueStats:
        return self._queue.stats()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is queued for up to ``timeout_s``, then drop the rest (counted
        ``send_failed``) and abort a POST still in flight. Returns in about ``timeout_s``."""
        if not self._queue.stop(timeout_s):
            self._http.abort()
            return
        self._http.close()

    def _send(self, body: bytes) -> None:
        """One POST (queue thread only). Raises RetryableError or PermanentError, as the spec says:
        5xx retried, 429 no sooner than its Retry-After, any other non-2xx dropped."""
        answer = self._http.post(body)
        status = answer.status
        if 200 <= status < 300:
            return
        reason = f"HTTP {status} from {self._http.url}: {answer.text()}"
        if status >= 500:
            raise RetryableError(reason)
        if status == 429:
            raise RetryableError(reason, answer.retry_after_s())
        raise PermanentError(reason)


__all__ = ["RemoteWriteConfig", "RemoteWriteExporter"]
