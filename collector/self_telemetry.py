"""The collector's own health as Prometheus families, named like the OpenTelemetry Collector's.

Receivers count data points accepted and refused per transport
(``otelcol_receiver_{accepted,refused}_metric_points{receiver="otlp",transport}``);
exporters report sent, failed and dropped points and their queue
(``otelcol_exporter_{sent,send_failed,enqueue_failed}_metric_points``,
``otelcol_exporter_queue_{size,capacity}``, labelled ``exporter``); the store
reports the series it holds. Thread-safety: `count` takes a lock; `families`
reads exporters' own thread-safe `stats()`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from collector.exposition import SelfFamily
from otel_llm.exposition import label_text
from otel_llm.instruments import Kind


class SelfTelemetry:
    def __init__(self, num_series: Callable[[], int]):
        self._lock = threading.Lock()
        self._receiver: dict[str, list[int]] = {}  # transport -> [accepted, refused]
        self._exporters: list = []  # objects with .name and .stats() -> (sent, send_failed, enqueue_failed, size, capacity)
        self._num_series = num_series

    def count(self, transport: str, accepted: int, refused: int) -> None:
        with self._lock:
            counts = self._receiver.setdefault(transport, [0, 0])
            counts[0] += accepted
            counts[1] += refused

    def add_exporter(self, exporter) -> None:
        self._exporters.append(exporter)

    def families(self) -> tuple[SelfFamily, ...]:
        with self._lock:
            receiver = {t: tuple(c) for t, c in self._receiver.items()}
        rx = {t: label_text((("receiver", "otlp"), ("transport", t))) for t in receiver}
        out = [
            SelfFamily("otelcol_receiver_accepted_metric_points", Kind.COUNTER,
                       "Number of metric points successfully pushed into the pipeline.",
                       tuple((rx[t], c[0]) for t, c in receiver.items())),
            SelfFamily("otelcol_receiver_refused_metric_points", Kind.COUNTER,
                       "Number of metric points that could not be pushed into the pipeline.",
                       tuple((rx[t], c[1]) for t, c in receiver.items())),
        ]
        if self._exporters:
            stats = [(label_text((("exporter", e.name), ("data_type", "metrics"))), e.stats()) for e in self._exporters]
            for i, (name, kind, help_text) in enumerate((
                ("otelcol_exporter_sent_metric_points", Kind.COUNTER,
                 "Number of metric points successfully sent to destination."),
                ("otelcol_exporter_send_failed_metric_points", Kind.COUNTER,
                 "Number of metric points in failed attempts to send to destination."),
                ("otelcol_exporter_enqueue_failed_metric_points", Kind.COUNTER,
                 "Number of metric points failed to be added to the sending queue."),
                ("otelcol_exporter_queue_size", Kind.GAUGE, "Current size of the retry queue (in batches)."),
                ("otelcol_exporter_queue_capacity", Kind.GAUGE, "Fixed capacity of the retry queue (in batches)."),
            )):
                out.append(SelfFamily(name, kind, help_text, tuple((labels, s[i]) for labels, s in stats)))
        out.append(SelfFamily("otel_llm_collector_series", Kind.GAUGE, "Input series the collector holds.",
                              (("", self._num_series()),)))
        return tuple(out)
