"""The collector's own health as Prometheus families, named like the OpenTelemetry Collector's.

Receivers count what they accepted and refused per transport and signal
(``otelcol_receiver_{accepted,refused}_{metric_points,spans}{receiver="otlp"|"prometheus",transport}``);
exporters report sent, failed and dropped records and their queue
(``otelcol_exporter_{sent,send_failed,enqueue_failed}_{metric_points,spans}``,
``otelcol_exporter_queue_{size,capacity}``, labelled ``exporter`` and ``data_type``); the
store reports the series it holds; each HTTP listener the connections it closed before or
instead of serving them (``otel_llm_collector_connections_closed_total{listener,reason}``:
refused with a 503, idle, past the header or body deadline). Span families appear once the
collector takes traces.
Thread-safety: `count` takes a lock; `families` reads exporters' and listeners' own thread-safe
`stats()`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from otel_llm.canonical.instruments import Kind
from otel_llm.collector.exporter.prometheus.exposition import SelfFamily
from otel_llm.export.export_counts import RECORDS, exporter_families
from otel_llm.export.exposition import label_text


class SelfTelemetry:
    def __init__(self, num_series: Callable[[], int], data_types: tuple[str, ...] = ("metrics",)):
        self._lock = threading.Lock()
        self._data_types = data_types
        self._receiver: dict[tuple[str, str, str], list[int]] = {}  # (data type, receiver, transport) -> counts
        self._exporters: list = []  # with .name, .data_type, .stats() -> (sent, send_failed, enqueue_failed, size, cap)
        self._listeners: list[tuple[str, object]] = []  # (name, HttpEndpoint)
        self._num_series = num_series

    def count(self, transport: str, accepted: int, refused: int, data_type: str = "metrics",
              receiver: str = "otlp") -> None:
        with self._lock:
            counts = self._receiver.setdefault((data_type, receiver, transport), [0, 0])
            counts[0] += accepted
            counts[1] += refused

    def add_exporter(self, exporter) -> None:
        self._exporters.append(exporter)

    def add_listener(self, name: str, endpoint) -> None:
        self._listeners.append((name, endpoint))

    def families(self) -> tuple[SelfFamily, ...]:
        with self._lock:
            receiver = {key: tuple(c) for key, c in self._receiver.items()}
        out = []
        for data_type in self._data_types:
            records, words = RECORDS[data_type]
            counts = [(label_text((("receiver", r), ("transport", t))), c)
                      for (d, r, t), c in receiver.items() if d == data_type]
            out += [
                SelfFamily(f"otelcol_receiver_accepted_{records}", Kind.COUNTER,
                           f"Number of {words} successfully pushed into the pipeline.",
                           tuple((labels, c[0]) for labels, c in counts)),
                SelfFamily(f"otelcol_receiver_refused_{records}", Kind.COUNTER,
                           f"Number of {words} that could not be pushed into the pipeline.",
                           tuple((labels, c[1]) for labels, c in counts)),
            ]
        out += exporter_families(self._exporters, prefix="otelcol", queue_unit="batches")
        traces = [e for e in self._exporters if e.data_type == "traces"]
        if traces:  # the on-disk queue's at-least-once: what a backend may get twice
            out.append(SelfFamily(
                "otel_llm_exporter_resent_spans", Kind.COUNTER,
                "Number of spans that were in flight when the last run ended, sent again after the restart.",
                tuple((label_text((("exporter", e.name), ("data_type", e.data_type))), e.stats().resent)
                      for e in traces)))
        if self._listeners:
            out.append(SelfFamily(
                "otel_llm_collector_connections_closed", Kind.COUNTER,
                "Connections an HTTP listener closed before or instead of serving them, by reason.",
                tuple((label_text((("listener", name), ("reason", reason))), count)
                      for name, endpoint in self._listeners for reason, count in endpoint.stats().as_reasons())))
        out.append(SelfFamily("otel_llm_collector_series", Kind.GAUGE, "Input series the collector holds.",
                              (("", self._num_series()),)))
        return tuple(out)
