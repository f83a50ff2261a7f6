"""Feeds the trace store like a backend: the traces pipeline offers each request to this writer's
queue (never blocking a receiver); its one thread adds merged batches to the `TraceStore` (one
SQLite transaction each), the single writer the store expects.

Counted like every exporter (``otelcol_exporter_*_spans{exporter="tracestore"}``): a batch the
store refuses (malformed, or the database failing) is dropped and counted ``send_failed``. The
queue is in memory: what waits for the store at a crash is lost (the backends' queues can be
on disk, `--storage-dir`).
"""

from __future__ import annotations

import sqlite3

from otel_llm.collector.exporter.queue import Batch, ExporterQueue, PermanentError, QueueConfig, QueueStats, RetryConfig
from otel_llm.collector.tracestore.store import TraceStore

_BATCH_SPANS = 4096  # larger transactions are cheaper per span; a store batch commits in a few ms


class TraceStoreWriter:
    data_type = "traces"

    def __init__(self, store: TraceStore, name: str = "tracestore") -> None:
        self.store, self.name = store, name
        self._queue: ExporterQueue[bytes] = ExporterQueue(
            name, self._send, QueueConfig(queue_size=1000, max_bytes=64 * 1024 * 1024), RetryConfig(enabled=False),
            unit="spans", batch=Batch(_BATCH_SPANS, b"".join))

    def start(self) -> None:
        self._queue.start()

    def export(self, request: bytes, spans: int) -> None:
        self._queue.offer(request, spans, len(request))

    def stats(self) -> QueueStats:
        return self._queue.stats()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Store what is queued for up to ``timeout_s`` (the store stays open; the caller closes it)."""
        self._queue.stop(timeout_s)

    def _send(self, body: bytes) -> None:
        try:
            self.store.add(body)
        except (ValueError, sqlite3.Error) as exc:
            raise PermanentError(f"trace store refused {len(body)} bytes: {exc}") from exc
