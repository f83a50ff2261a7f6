"""The sending queue and retry loop every exporter of the collector uses.

The shape of the OpenTelemetry Collector's exporterhelper (``sending_queue`` +
``retry_on_failure``): producers `offer` items without ever blocking; one
consumer thread hands them, oldest first, to the exporter's ``send``; ``send``
raises `RetryableError` (retried with exponential backoff, up to the retry
config's max elapsed time) or `PermanentError` (dropped at once).

Accounting is in the records each item carries (metric points, spans), the
collector's ``otelcol_exporter_*`` counters: every record offered ends up in
exactly one of ``sent``, ``send_failed`` (permanent error, retries exhausted, or
dropped at `stop`) or ``enqueue_failed`` (queue full or stopped, or refused by
the exporter before queueing), or is still queued or in flight. Drops are logged
as one warning per interval with the totals, never one line per record or request.

With a `Batch`, the consumer merges the items waiting behind the one it takes, up
to ``max_records``, into one send (it never waits for more to arrive). Items are
kept in memory, or (a `SqliteStorage`) on disk: then what is still queued at `stop`
stays there for the next start instead of being dropped.

Thread-safety: `offer`, `reject`, `stats` and `stop` may be called from any
thread; ``send`` is only ever called from the consumer thread, one item at a
time, so whatever it uses (a connection) needs no lock of its own.

Size: the exporterhelper's one component: the sending queue and the retry loop share their state (in
flight, drops, the storage).
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from otel_llm.collector.exporter.queue_storage import MemoryStorage, SqliteStorage

logger = logging.getLogger(__name__)

T = TypeVar("T")

_DROP_LOG_INTERVAL_S = 10.0


class RetryableError(Exception):
    """The send failed but may succeed later (5xx, 429, network). ``retry_after_s``:
    the receiver's minimum delay before the next try (e.g. from ``Retry-After``)."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class PermanentError(Exception):
    """The send can never succeed (e.g. 4xx): the item is dropped without retrying."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class QueueConfig:
    # In requests (items), like exporterhelper's default "requests" sizer. Its default
    # of 1000 is for small OTLP batches; a remote-write request holds up to
    # max_samples_per_send samples, so 256 requests already buffer ~0.5 M samples.
    queue_size: int = 256
    max_bytes: int | None = None  # also bounds the bytes queued (items offered with a size)

    def __post_init__(self) -> None:
        if isinstance(self.queue_size, bool) or not isinstance(self.queue_size, int) or self.queue_size < 1:
            raise ValueError(f"QueueConfig.queue_size must be an int >= 1, got {self.queue_size!r}")
        if self.max_bytes is not None and (not isinstance(self.max_bytes, int) or self.max_bytes < 1):
            raise ValueError(f"QueueConfig.max_bytes must be None or an int >= 1, got {self.max_bytes!r}")


@dataclass(frozen=True)
class RetryConfig:
    """Exponential backoff between tries of one item.

    Defaults: initial interval, multiplier, randomization and max elapsed time are the
    contrib ``prometheusremotewrite`` exporter's ``retry_on_failure`` (50 ms, 1.5, 0.5,
    5 min); the max interval is Prometheus' own remote-write ``max_backoff`` (5 s,
    ``config/config.go @v2.42.0``) rather than that exporter's 30 s, so a backend that
    comes back is noticed within seconds.
    """

    enabled: bool = True  # False: one try, then drop
    initial_interval_s: float = 0.05
    multiplier: float = 1.5
    max_interval_s: float = 5.0
    max_elapsed_time_s: float = 300.0  # from the first try; 0 = retry forever
    randomization_factor: float = 0.5  # each delay is drawn from interval * [1 - f, 1 + f]

    def __post_init__(self) -> None:
        checks = (
            ("initial_interval_s", self.initial_interval_s > 0, "> 0"),
            ("multiplier", self.multiplier >= 1, ">= 1"),
            ("max_interval_s", self.max_interval_s >= self.initial_interval_s, ">= initial_interval_s"),
            ("max_elapsed_time_s", self.max_elapsed_time_s >= 0, ">= 0"),
            ("randomization_factor", 0 <= self.randomization_factor <= 1, "in [0, 1]"),
        )
        for name, ok, rule in checks:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
                raise ValueError(f"RetryConfig.{name} must be {rule}, got {value!r}")


class Batch(NamedTuple):
    max_records: int  # an item alone may carry more; it is sent alone
    merge: Callable[[list], object]  # items -> one item of the same type


class QueueStats(NamedTuple):
    sent: int  # records
    send_failed: int  # records
    enqueue_failed: int  # records
    queue_size: int  # items waiting (not the one in flight)
    queue_capacity: int  # items
    resent: int = 0  # records in flight when the last run ended (on-disk queue), sent again: maybe twice


class ExporterQueue(Generic[T]):
    """A bounded FIFO of items and the one daemon thread that sends them.

    ``name`` (the exporter's id, e.g. ``prometheusremotewrite/0``) prefixes log lines;
    ``unit`` names the records in them. Items offered before `start` wait in the queue.
    """

    def __init__(
        self,
        name: str,
        send: Callable[[T], None],
        queue: QueueConfig = QueueConfig(),
        retry: RetryConfig = RetryConfig(),
        unit: str = "points",
        batch: Batch | None = None,
        storage: MemoryStorage | SqliteStorage | None = None,
    ) -> None:
        self.name = name
        self._send = send
        self._batch = batch
        self._capacity = queue.queue_size
        self._max_bytes = queue.max_bytes
        self._retry = retry
        self._random = random.Random()
        self._cond = threading.Condition()
        # Guarded by _cond:
        self._items = storage if storage is not None else MemoryStorage()
        self._closed = False
        self._stop_deadline = float("inf")  # monotonic; retries and sends end there
        self._sent = self._send_failed = self._enqueue_failed = 0
        self._thread: threading.Thread | None = None
        self._drops = _DropLog(name, unit)

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                raise RuntimeError(f"{self.name}: queue already started")
            self._thread = threading.Thread(target=self._run, name=f"{self.name}-sender", daemon=True)
        self._thread.start()

    def offer(self, item: T, points: int, size_bytes: int = 0) -> bool:
        """Queue ``item`` (carrying ``points`` records, ``size_bytes`` long) unless full or stopped;
        never blocks. On False the records are counted ``enqueue_failed``."""
        with self._cond:
            items = self._items
            fits = self._max_bytes is None or items.bytes + size_bytes <= self._max_bytes
            if not self._closed and items.count < self._capacity and fits:
                try:
                    items.put(item, points, size_bytes)
                    self._cond.notify()
                    return True
                except sqlite3.Error as exc:  # the disk is full or gone: this item only
                    reason = f"cannot store in the sending queue: {exc}"
            else:
                reason = ("exporter stopped" if self._closed else
                          f"sending queue full ({self._capacity} requests, {self._max_bytes} bytes)")
            self._enqueue_failed += points
        self._drops.drop("enqueue_failed", points, reason)
        return False

    def reject(self, points: int, reason: str) -> None:
        """Count ``points`` the exporter could not even queue (e.g. unencodable) as ``enqueue_failed``."""
        with self._cond:
            self._enqueue_failed += points
        self._drops.drop("enqueue_failed", points, reason)

    def stats(self) -> QueueStats:
        with self._cond:
            return QueueStats(self._sent, self._send_failed, self._enqueue_failed,
                              self._items.count, self._capacity, self._items.resent_records)

    def stop(self, timeout_s: float) -> bool:
        """Refuse new items; keep sending (and retrying) what is queued for up to
        ``timeout_s``; then drop what is still queued, counted ``send_failed`` (on disk,
        it stays for the next start).

        Returns within about ``timeout_s``: True if everything was sent or dropped by the
        consumer and it has exited; False if a send was still in flight (its outcome is
        counted when it returns, without retries) -- the caller may then abort it.
        Idempotent.
        """
        with self._cond:
            self._closed = True
            self._stop_deadline = min(self._stop_deadline, time.monotonic() + max(0.0, timeout_s))
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(0.0, timeout_s))
        with self._cond:
            requests = self._items.count
            dropped = self._items.clear()
            self._send_failed += dropped
            stopped = thread is None or not thread.is_alive()
            if stopped:
                self._items.close()
        if dropped:
            self._drops.drop("send_failed", dropped, f"still queued at shutdown ({requests} requests)")
        self._drops.flush()
        return stopped

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items.count and not self._closed:
                    self._cond.wait()
                try:
                    taken = self._items.take(None if self._batch is None else self._batch.max_records)
                except sqlite3.Error:
                    logger.exception("%s: cannot read the sending queue; the sender stops", self.name)
                    return
                if taken is None:
                    return
            points = taken.records
            item = taken.items[0] if len(taken.items) == 1 else self._batch.merge(taken.items)
            error, interrupted = self._deliver(item)
            with self._cond:
                if interrupted and self._items.persistent:
                    return  # shutdown: the batch stays on disk and is sent after the restart
                if error is None:
                    self._sent += points
                else:
                    self._send_failed += points
                try:
                    self._items.done(taken.key)
                except sqlite3.Error:  # it stays in the file and is sent again after a restart
                    logger.exception("%s: cannot remove a sent batch from the sending queue", self.name)
            if error is not None:
                self._drops.drop("send_failed", points, error)

    def _deliver(self, item: T) -> tuple[str | None, bool]:
        """Try ``item`` until sent (None) or given up (the reason); True when shutdown stopped it."""
        first_try = time.monotonic()
        interval = self._retry.initial_interval_s
        while True:
            if time.monotonic() >= self._stop_deadline:  # a float read; stop() only lowers it
                return "not sent before the shutdown deadline", True
            try:
                self._send(item)
                return None, False
            except PermanentError as exc:
                return exc.reason, False
            except RetryableError as exc:
                failure, retry_after_s = exc.reason, exc.retry_after_s
            except Exception as exc:  # a bug in send: drop the item, keep the thread
                logger.exception("%s: send raised unexpectedly", self.name)
                return f"unexpected {type(exc).__name__}: {exc}", False
            if not self._retry.enabled:
                return failure, False
            jitter = self._retry.randomization_factor * (2 * self._random.random() - 1)
            delay = max(interval * (1 + jitter), retry_after_s or 0.0)
            interval = min(interval * self._retry.multiplier, self._retry.max_interval_s)
            retry_at = time.monotonic() + delay
            max_elapsed_s = self._retry.max_elapsed_time_s
            if max_elapsed_s and retry_at - first_try > max_elapsed_s:
                return f"{failure} (no retry left within {max_elapsed_s:g} s)", False
            logger.debug("%s: send failed (%s); retrying in %.3f s", self.name, failure, delay)
            if not self._wait_until(retry_at):
                return f"{failure} (stopped before the next retry)", True

    def _wait_until(self, retry_at: float) -> bool:
        """Sleep until ``retry_at`` (monotonic); False as soon as that is past the stop
        deadline (which `stop` may set or bring forward during the sleep)."""
        with self._cond:
            while retry_at <= self._stop_deadline:
                remaining = retry_at - time.monotonic()
                if remaining <= 0:
                    return True
                self._cond.wait(remaining)
            return False


class _DropLog:
    """Warns about dropped points at most once per interval, with the totals since the
    last warning and the latest reason per kind. Thread-safe."""

    def __init__(self, name: str, unit: str, interval_s: float = _DROP_LOG_INTERVAL_S) -> None:
        self._name, self._unit = name, unit
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last_log = float("-inf")
        self._pending: dict[str, list] = {}  # kind -> [points, requests, last reason]

    def drop(self, kind: str, points: int, reason: str) -> None:
        with self._lock:
            pending = self._pending.setdefault(kind, [0, 0, ""])
            pending[0] += points
            pending[1] += 1
            pending[2] = reason
            if time.monotonic() - self._last_log < self._interval_s:
                return
        self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            if pending:
                self._last_log = time.monotonic()
        for kind, (points, requests, reason) in pending.items():
            logger.warning("%s: dropped %d %s in %d requests (%s); last reason: %s",
                           self._name, points, self._unit, requests, kind, reason)


__all__ = [
    "Batch",
    "ExporterQueue",
    "PermanentError",
    "QueueConfig",
    "QueueStats",
    "RetryConfig",
    "RetryableError",
]
