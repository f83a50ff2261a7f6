"""The aggregated metric state of one `Telemetry`: histograms, counters, gauges.

Written by the frontend's ingest thread, read by collection (Prometheus render,
OTel readers) under the owner's lock. Counters are plain Python ints/floats per
series (a few adds per step); histograms are `HistogramState`s. A gauge is one
value, or for an instrument with dims one array of a value per series (its
writer replaces the array); None until first set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otel_llm.canonical.aggregation import HistogramState
from otel_llm.canonical.instruments import Instrument, Kind


class MetricsState:
    """All instruments' state, keyed by canonical name. Histograms in seconds are recorded in ns
    (`seconds_in_ns=False`: in seconds, as vLLM's stats objects carry them)."""

    def __init__(self, table: dict[str, Instrument], seconds_in_ns: bool = True):
        self.table = table
        self.histograms: dict[str, HistogramState] = {}
        self.counters: dict[str, np.ndarray] = {}
        self.gauges: dict[str, float | np.ndarray | None] = {}
        for name, inst in table.items():
            if inst.kind is Kind.HISTOGRAM:
                self.histograms[name] = HistogramState(inst.buckets, inst.num_series, inst.exemplars,
                                                        1e-9 if inst.unit == "s" and seconds_in_ns else 1.0)
            elif inst.kind is Kind.COUNTER:
                self.counters[name] = np.zeros(inst.num_series, np.float64)
            else:
                self.gauges[name] = None  # unset until first observed

    def add(self, name: str, value: float, series: int = 0) -> None:
        self.counters[name][series] += value

    def add_many(self, name: str, series: np.ndarray) -> None:
        """Count one per element of `series` (vectorised)."""
        c = self.counters[name]
        c += np.bincount(series, minlength=len(c))[: len(c)]

    def flush(self, now_ns: int) -> None:
        for h in self.histograms.values():
            h.flush(now_ns)

    def snapshot(self, now_ns: int) -> MetricsSnapshot:
        """Flush and copy: the result is immutable and safe to render off-lock."""
        self.flush(now_ns)
        return MetricsSnapshot(
            {k: HistogramSnapshot(h.bounds, h.counts.copy(), h.sums.copy(), h.mins.copy(), h.maxs.copy(),
                                  (h.ex_trace.copy(), h.ex_value.copy(), h.ex_time_ns.copy()) if h.exemplars else None)
             for k, h in self.histograms.items()},
            {k: c.copy() for k, c in self.counters.items()},
            {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in self.gauges.items()},
        )


@dataclass(frozen=True)
class HistogramSnapshot:
    bounds: np.ndarray
    counts: np.ndarray  # [series, buckets], not cumulative
    sums: np.ndarray
    mins: np.ndarray
    maxs: np.ndarray
    exemplars: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # trace [series*nb, 3], value, time


@dataclass(frozen=True)
class MetricsSnapshot:
    histograms: dict[str, HistogramSnapshot]
    counters: dict[str, np.ndarray]
    gauges: dict[str, float | np.ndarray | None]  # an array (per series) for a gauge with dims
