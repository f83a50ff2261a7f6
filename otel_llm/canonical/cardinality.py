"""Cardinality limits: at most `limit` series per instrument; further ones share one overflow series.

As the OpenTelemetry metrics SDK specification defines them (and the Python SDK implements
them): the first `limit` distinct attribute sets of an instrument get series of their own;
every measurement for another attribute set is aggregated into one extra series whose only
attribute is `otel.metric.overflow=true` (Prometheus: `otel_metric_overflow="true"`). Admission
is first come, never revoked, so a series never moves. What overflowed is counted
(`otel_llm_metric_overflow_measurements_total{metric}`), so an operator sees that some
breakdown undercounts (the totals stay right).

Attributes whose values come from outside are bounded this way: LoRA adapter names
(`lora.py`) and the base label sets (model, engine, version) of the Telemetries one renderer
or one OTLP reader collects together (`fold` merges the sources beyond the limit into the
overflow source). Every other attribute has a fixed vocabulary (`instruments.DIMENSIONS`).

Thread-safety: none; each limiter belongs to one owner that holds its lock (a Telemetry,
a Renderer, a reader's collect callback).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace

import numpy as np

from otel_llm.canonical.instruments import Instrument, Kind
from otel_llm.canonical.metrics_state import HistogramSnapshot, MetricsSnapshot

DEFAULT_CARDINALITY_LIMIT = 2000  # the OTel SDKs' default, and the collector's
OVERFLOW_ATTRIBUTE = "otel.metric.overflow"
OVERFLOW_LABEL = ("otel_metric_overflow", "true")
OVERFLOW = -1  # the slot of the overflow series
OVERFLOW_FAMILY = "otel_llm_metric_overflow_measurements"  # counter: `metric` = canonical instrument
OVERFLOW_INSTRUMENT = "otel_llm.metric.overflow.measurements"  # its OTLP name, attribute `metric`
OVERFLOW_HELP = ("Measurements aggregated into an otel_metric_overflow series because an instrument "
                 "reached its cardinality limit, by canonical instrument.")


def check_limit(limit) -> int:
    """A valid cardinality limit (an int >= 1), else ValueError naming it."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"cardinality_limit must be an int >= 1, got {limit!r}")
    return limit


class CardinalityLimiter:
    """Attribute keys -> series slots 0 .. limit-1, in order of first use; OVERFLOW after that.

    Holds at most `limit` keys. `overflowed` counts the measurements given OVERFLOW."""

    __slots__ = ("limit", "_slots", "overflowed")

    def __init__(self, limit: int = DEFAULT_CARDINALITY_LIMIT):
        self.limit = check_limit(limit)
        self._slots: dict[Hashable, int] = {}
        self.overflowed = 0

    def slot(self, key: Hashable, measurements: int = 1) -> int:
        """The key's slot, admitting it while there is room; OVERFLOW (counting `measurements`) else."""
        s = self._slots.get(key)
        if s is None:
            if len(self._slots) >= self.limit:
                self.overflowed += measurements
                return OVERFLOW
            s = self._slots[key] = len(self._slots)
        return s

    def keys(self) -> list:
        """The admitted keys, by slot."""
        return list(self._slots)

    def __len__(self) -> int:
        return len(self._slots)


def _rebucket(counts: np.ndarray, bounds: tuple[float, ...], common: tuple[float, ...]) -> np.ndarray:
    """Per-series bucket counts on `bounds` -> on `common` (a subset of them): exact."""
    if bounds == common:
        return counts
    cols = np.append(np.searchsorted(np.asarray(bounds, np.float64), np.asarray(common, np.float64)),
                     counts.shape[1] - 1)
    return np.diff(np.cumsum(counts, axis=1)[:, cols], axis=1, prepend=0)


def _shared(bounds) -> tuple[float, ...]:
    common = set(bounds[0])
    for b in bounds[1:]:
        common &= set(b)
    return tuple(sorted(common))


def fold(snapshots: list[MetricsSnapshot], tables: list[dict[str, Instrument]], sum_gauges: bool = False
         ) -> tuple[MetricsSnapshot, dict[str, Instrument]]:
    """The sources beyond a limit as one (their overflow series): counters and histograms add up
    per series (a renderer then sums the series, dropping every label), a gauge keeps the last
    source's value (OTel's last-value aggregation); `sum_gauges`: engines merged into one server's
    view instead, so a count gauge adds up and a ratio (unit "1") is their mean. Histograms of sources with different bounds
    fold onto the bounds they all share (cumulative counts at a shared bound add up exactly);
    the returned table says which. No exemplars."""
    first = tables[0]
    same = all(t is first or t == first for t in tables)  # (equal tables: the first's, a stable cache key)
    table = first if same else dict(first)
    hists, counters, gauges = {}, {}, {}
    for name, inst in first.items():
        parts = [(s, t[name]) for s, t in zip(snapshots, tables) if name in t and t[name].kind is inst.kind]
        if inst.kind is Kind.HISTOGRAM:
            parts = [(s.histograms[name], i) for s, i in parts
                     if s.histograms[name].counts.shape[0] == inst.num_series]
            common = _shared([i.buckets for _, i in parts])
            export = _shared([i.otlp_buckets for _, i in parts])
            if not same:
                table[name] = replace(inst, buckets=common, export_buckets=None if export == common else export)
            nb = len(common) + 1
            counts = np.zeros((inst.num_series, nb), np.int64)
            sums = np.zeros(inst.num_series)
            mins, maxs = np.full(inst.num_series, np.inf), np.full(inst.num_series, -np.inf)
            for h, i in parts:
                counts += _rebucket(h.counts, i.buckets, common)
                sums += h.sums
                np.minimum(mins, h.mins, out=mins)
                np.maximum(maxs, h.maxs, out=maxs)
            hists[name] = HistogramSnapshot(np.asarray(common, np.float64), counts, sums, mins, maxs, None)
        elif inst.kind is Kind.COUNTER:
            total = np.zeros(inst.num_series)
            for s, _ in parts:
                c = s.counters[name]
                if len(c) == len(total):
                    total += c
            counters[name] = total
        else:
            values = [s.gauges.get(name) for s, _ in parts]
            if sum_gauges and any(v is not None for v in values):
                present = [v for v in values if v is not None]
                total = sum(present[1:], present[0].copy() if isinstance(present[0], np.ndarray) else present[0])
                gauges[name] = total / len(present) if inst.unit == "1" else total
            else:
                gauges[name] = next((v for v in reversed(values) if v is not None), None)
    return MetricsSnapshot(hists, counters, gauges), table
