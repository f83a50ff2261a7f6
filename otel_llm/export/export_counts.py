"""ExportCounts: what one exporter did with its records, in the OpenTelemetry Collector's words.

Every span or metric point handed to a counted pipeline ends up in exactly one of
`sent`, `send_failed` (the exporter answered FAILURE or raised) or `enqueue_failed`
(never queued: the queue was full, or the pipeline was shut down), or is still
queued or in the batch being sent. `exporter_families` exposes them as the
Collector's exporters do (`{prefix}_exporter_{sent,send_failed,enqueue_failed}_{spans,
metric_points}`, `{prefix}_exporter_queue_{size,capacity}`, labelled `exporter` and
`data_type`): `otel_llm_*` on the server, `otelcol_*` in the collector.

The counting wrappers are `tracer_setup.CountingBatchSpanProcessor` and
`meter_setup.CountingMetricExporter`. Thread-safety: `add` and `stats` take one lock,
held for an addition; `add` runs once per exported batch or dropped record, never
per record that goes through.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import NamedTuple

from otel_llm.canonical.instruments import Kind
from otel_llm.export.exposition import SelfFamily, label_text

RECORDS = {"metrics": ("metric_points", "metric points"), "traces": ("spans", "spans")}  # data type -> (name, words)


class ExporterStats(NamedTuple):
    sent: int  # records
    send_failed: int  # records
    enqueue_failed: int  # records
    queue_size: int  # records waiting (not the batch being sent)
    queue_capacity: int  # records; 0: the exporter has no queue


class ExportCounts:
    """The counts of one exporter (`name`, e.g. "otlp") of one `data_type` ("traces" or "metrics")."""

    def __init__(self, data_type: str, name: str = "otlp"):
        if data_type not in RECORDS:
            raise ValueError(f"data_type must be one of {tuple(RECORDS)}, got {data_type!r}")
        self.name, self.data_type = name, data_type
        self._lock = threading.Lock()
        self._sent = self._send_failed = self._enqueue_failed = 0
        self._queue_size: Callable[[], int] = lambda: 0
        self._queue_capacity = 0

    def watch_queue(self, size: Callable[[], int], capacity: int) -> None:
        """Report the exporter's queue: `size()` is read (any thread) at each `stats`."""
        self._queue_size, self._queue_capacity = size, capacity

    def add(self, sent: int = 0, send_failed: int = 0, enqueue_failed: int = 0) -> None:
        with self._lock:
            self._sent += sent
            self._send_failed += send_failed
            self._enqueue_failed += enqueue_failed

    def stats(self) -> ExporterStats:
        with self._lock:
            return ExporterStats(self._sent, self._send_failed, self._enqueue_failed, self._queue_size(),
                                 self._queue_capacity)


def exporter_families(exporters: Iterable, prefix: str = "otel_llm", queue_unit: str = "spans") -> list[SelfFamily]:
    """The families of `exporters` (each with `.name`, `.data_type` and `.stats()`, an
    ExporterStats or a tuple with its fields); a data type's counters appear once it has an
    exporter, queue gauges for exporters with a queue. `queue_unit`: what the queues hold."""
    stats = [(e.data_type, label_text((("exporter", e.name), ("data_type", e.data_type))), e.stats())
             for e in exporters]
    out = []
    for data_type, (records, words) in RECORDS.items():
        mine = [(labels, s) for d, labels, s in stats if d == data_type]
        if not mine:
            continue
        for field, help_text in (("sent", f"Number of {words} successfully sent to destination."),
                                 ("send_failed", f"Number of {words} in failed attempts to send to destination."),
                                 ("enqueue_failed", f"Number of {words} failed to be added to the sending queue.")):
            out.append(SelfFamily(f"{prefix}_exporter_{field}_{records}", Kind.COUNTER, help_text,
                                  tuple((labels, getattr(s, field)) for labels, s in mine)))
    queued = [(labels, s) for _, labels, s in stats if s.queue_capacity]
    if queued:
        for field, help_text in (("queue_size", f"Current size of the retry queue (in {queue_unit})."),
                                 ("queue_capacity", f"Fixed capacity of the retry queue (in {queue_unit}).")):
            out.append(SelfFamily(f"{prefix}_exporter_{field}", Kind.GAUGE, help_text,
                                  tuple((labels, getattr(s, field)) for labels, s in queued)))
    return out
