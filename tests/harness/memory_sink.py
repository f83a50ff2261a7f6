"""An in-memory, bounded sink for the OTLP receiver (tests, debugging).

Thread-safety: ``__call__`` runs on the receiver's request threads; it
flattens outside the lock and appends under one lock. Readers get tuples
(snapshots). When a signal's store is full, new records are dropped and
counted in ``dropped()``; nothing raises.
"""

import threading
import time
from typing import NamedTuple

from otel_llm.collector.pdata import otlp_codec
from otel_llm.collector.receiver.otlp_http import ROUTES, Signal
from tests.harness.otlp_records import LogRecord, MetricRecord, SpanRecord, flatten_logs, flatten_metrics, flatten_spans

_REQUEST_TYPES = {route.signal: route.request_type for route in ROUTES.values()}


class DroppedCounts(NamedTuple):
    spans: int
    metrics: int
    logs: int


class MemorySink:
    """Keeps up to ``max_records`` flattened records per signal."""

    def __init__(self, max_records: int = 100_000) -> None:
        if max_records <= 0:
            raise ValueError(f"max_records must be > 0, got {max_records!r}")
        self.max_records = max_records
        self._changed = threading.Condition()  # guards everything below
        self._spans: list[SpanRecord] = []
        self._metrics: list[MetricRecord] = []
        self._logs: list[LogRecord] = []
        self._dropped = {Signal.TRACES: 0, Signal.METRICS: 0, Signal.LOGS: 0}

    def __call__(self, signal: Signal, payload: bytes) -> None:
        """Raises PayloadError(400) when `payload` is not a valid request of `signal`."""
        request = otlp_codec.decode(payload, otlp_codec.PROTOBUF, _REQUEST_TYPES[signal])
        if signal is Signal.TRACES:
            records, store = flatten_spans(request), self._spans
        elif signal is Signal.METRICS:
            records, store = flatten_metrics(request), self._metrics
        else:
            records, store = flatten_logs(request), self._logs
        with self._changed:
            room = max(0, self.max_records - len(store))
            store.extend(records[:room])
            self._dropped[signal] += len(records) - min(room, len(records))
            self._changed.notify_all()

    def received_spans(self) -> tuple[SpanRecord, ...]:
        with self._changed:
            return tuple(self._spans)

    def received_metrics(self) -> tuple[MetricRecord, ...]:
        with self._changed:
            return tuple(self._metrics)

    def received_logs(self) -> tuple[LogRecord, ...]:
        with self._changed:
            return tuple(self._logs)

    def dropped(self) -> DroppedCounts:
        with self._changed:
            dropped = self._dropped
            return DroppedCounts(
                dropped[Signal.TRACES], dropped[Signal.METRICS], dropped[Signal.LOGS]
            )

    def clear(self) -> None:
        with self._changed:
            self._spans.clear()
            self._metrics.clear()
            self._logs.clear()

    def wait_for_spans(self, n: int, timeout_s: float = 10.0) -> tuple[SpanRecord, ...]:
        """Block until at least ``n`` spans arrived; TimeoutError after ``timeout_s``."""
        self._wait(lambda: len(self._spans) >= n, timeout_s, f"{n} spans")
        return self.received_spans()

    def wait_for_metrics(self, n: int, timeout_s: float = 10.0) -> tuple[MetricRecord, ...]:
        """Block until at least ``n`` metric records arrived."""
        self._wait(lambda: len(self._metrics) >= n, timeout_s, f"{n} metric records")
        return self.received_metrics()

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"waited {timeout_s}s for {what}; have {len(self._spans)} spans, "
                        f"{len(self._metrics)} metrics, {len(self._logs)} logs"
                    )
                self._changed.wait(left)
