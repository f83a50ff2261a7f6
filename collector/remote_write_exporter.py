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

import email.utils
import http.client
import logging
import math
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from collector.exporter_queue import (
    ExporterQueue,
    PermanentError,
    QueueConfig,
    QueueStats,
    RetryableError,
    RetryConfig,
)
from collector.prw_proto import PrwSeries, encode_write_request
from otel_llm import __version__

logger = logging.getLogger(__name__)

_MAX_LOGGED_BODY_CHARS = 512
_MAX_READ_BODY_BYTES = 64 * 1024  # a longer error body is cut and its connection closed
# The spec forbids letting users override these; Content-Length and Host are http.client's.
_RESERVED_HEADERS = frozenset({
    "content-encoding", "content-type", "user-agent", "x-prometheus-remote-write-version",
    "content-length", "host",
})
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


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
        parts = urllib.parse.urlsplit(self.url) if isinstance(self.url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"RemoteWriteConfig.url must be an http(s) URL with a host, got {self.url!r}")
        try:
            parts.port  # noqa: B018 -- raises on a bad port
        except ValueError:
            raise ValueError(f"RemoteWriteConfig.url has an invalid port: {self.url!r}") from None
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ValueError(f"RemoteWriteConfig.timeout_s must be > 0, got {self.timeout_s!r}")
        n = self.max_samples_per_send
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"RemoteWriteConfig.max_samples_per_send must be an int >= 1, got {n!r}")
        if not isinstance(self.queue, QueueConfig) or not isinstance(self.retry, RetryConfig):
            raise ValueError(f"RemoteWriteConfig.queue/retry must be QueueConfig/RetryConfig, "
                             f"got {self.queue!r} / {self.retry!r}")
        for header in self.headers:
            if not (isinstance(header, tuple) and len(header) == 2
                    and all(isinstance(x, str) for x in header) and _TOKEN.match(header[0])
                    and not any(c in header[1] for c in "\r\n\0")):
                raise ValueError(f"RemoteWriteConfig.headers: {header!r} is not a (name, value) pair "
                                 "of a valid header name and a one-line value")
            if header[0].lower() in _RESERVED_HEADERS:
                raise ValueError(f"RemoteWriteConfig.headers must not set {header[0]!r}; "
                                 "the exporter sets it as remote-write requires")
        if not self.name:
            raise ValueError("RemoteWriteConfig.name must not be empty")


class RemoteWriteExporter:
    """Sends to one remote-write URL from its own queue and thread.

    Thread-safety: `export`, `stats` and `stop` may be called from any thread; the
    connection belongs to the queue's thread.
    """

    def __init__(self, config: RemoteWriteConfig) -> None:
        self.config = config
        self.name = config.name
        parts = urllib.parse.urlsplit(config.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = {
            **dict(config.headers),
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"otel-llm/{__version__}",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        }
        self._queue: ExporterQueue[bytes] = ExporterQueue(self.name, self._send, config.queue, config.retry)
        self._conn_lock = threading.Lock()  # guards the reference only; the queue thread uses it
        self._conn: http.client.HTTPConnection | None = None

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
            if not self._queue.offer(body, len(chunk)):
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
            with self._conn_lock:
                sock = self._conn.sock if self._conn is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # the queue thread's read fails at once
                except OSError:
                    pass
            return
        self._close()

    def _send(self, body: bytes) -> None:
        """One POST (queue thread only). Raises RetryableError or PermanentError."""
        try:
            conn = self._connection()
            conn.request("POST", self._path, body, self._headers)
            response = conn.getresponse()
            data = response.read(_MAX_READ_BODY_BYTES)
            if not response.isclosed():
                self._close()
        except (OSError, http.client.HTTPException) as exc:
            self._close()
            raise RetryableError(f"POST {self.config.url} failed: {exc!r}") from exc
        status = response.status
        if 200 <= status < 300:
            return
        if response.getheader("Connection", "").lower() == "close":
            self._close()
        reason = f"HTTP {status} from {self.config.url}: {_body_text(data)}"
        if status >= 500:
            raise RetryableError(reason)
        if status == 429:
            raise RetryableError(reason, _retry_after_s(response.getheader("Retry-After")))
        raise PermanentError(reason)

    def _connection(self) -> http.client.HTTPConnection:
        with self._conn_lock:
            if self._conn is None:
                cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                self._conn = cls(self._host, self._port, timeout=self.config.timeout_s)
            return self._conn

    def _close(self) -> None:
        with self._conn_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _body_text(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    if len(text) > _MAX_LOGGED_BODY_CHARS:
        return text[:_MAX_LOGGED_BODY_CHARS] + "... (truncated)"
    return text or "(empty body)"


def _retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: delay-seconds or an HTTP date; None if absent or invalid."""
    if not value:
        return None
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


__all__ = ["RemoteWriteConfig", "RemoteWriteExporter"]
