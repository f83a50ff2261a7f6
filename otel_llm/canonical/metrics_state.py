"""The aggregated metric state of one `Telemetry`: histograms, counters, gauges.

Written by the frontend's ingest thread, read by collection (Prometheus render,
OTel readers) under the owner's lock. Counters are an array of a value per series
(a few adds per step); histograms are `HistogramState`s. A gauge is one value, or
for an instrument with dims one array of a value per series (its writer replaces
the array); None until first set.

Every counter's and histogram's arrays are views into one buffer of 8-byte words
(`_Arena`), written in place, so a snapshot copies the whole state at once and cuts
its arrays out of the copy instead of copying ~130 small arrays one by one (a
vLLM-scale state: ~60 -> ~25 us per snapshot).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

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
        self._arena = _Arena(self)

    def add(self, name: str, value: float, series: int = 0) -> None:
        self.counters[name][series] += value

    def add_many(self, name: str, series: np.ndarray) -> None:
        """Count one per element of `series` (vectorised)."""
        c = self.counters[name]
        c += np.bincount(series, minlength=len(c))[: len(c)]

    def flush(self, now_ns: int) -> None:
        for h in self.histograms.values():
            h.flush(now_ns)

    def snapshot(self, now_ns: int, exemplars: bool = True) -> MetricsSnapshot:
        """Flush and copy: the result is immutable and safe to render off-lock. `exemplars=False`: without
        the histograms' exemplars (for a reader that does not show them: the Prometheus text format)."""
        self.flush(now_ns)
        histograms, counters = self._arena.copy(exemplars)
        return MetricsSnapshot(histograms, counters,
                               {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in self.gauges.items()})


_HISTOGRAM_ARRAYS = ("counts", "sums", "mins", "maxs")
_EXEMPLAR_ARRAYS = ("ex_trace", "ex_value", "ex_time_ns")


class _Arena:
    """One buffer of 8-byte words holding every counter's and histogram's arrays: at construction each
    array is moved into it (the owner's attribute or dict entry replaced by a view of the same dtype and
    shape); `copy` copies the buffer once and cuts the same views out of the copy (a slice each, a
    reshape for a 2-D one: cheaper than copying each small array). Views keep their buffer alive, so
    the previous copy is written over only when no view of it is left (its reference count says so)."""

    def __init__(self, state: MetricsState):
        arrays = [getattr(h, name) for h in state.histograms.values() for name in _HISTOGRAM_ARRAYS]
        arrays += state.counters.values()
        exemplar_arrays = [getattr(h, name) for h in state.histograms.values() if h.exemplars
                           for name in _EXEMPLAR_ARRAYS]
        self.main = sum(a.size for a in arrays)  # words before the exemplars, which come last
        self.words = np.empty(self.main + sum(a.size for a in exemplar_arrays), np.int64)
        at = [0]

        def move(owner, attr, dtype) -> tuple[int, int]:
            a = getattr(owner, attr)
            start = at[0]
            at[0] += a.size
            view = self.words[start:at[0]].view(dtype).reshape(a.shape)  # the dtype `copy` cuts it as
            view[...] = a
            setattr(owner, attr, view)
            return start, at[0]

        self._histograms = []  # (name, bounds, counts' shape, (start, end) of each array)
        for name, h in state.histograms.items():
            spans = ()
            for attr, dtype in zip(_HISTOGRAM_ARRAYS, (np.int64, np.float64, np.float64, np.float64)):
                spans += move(h, attr, dtype)
            self._histograms.append((name, h.bounds, h.counts.shape, spans))
        self._counters = []
        for name, c in state.counters.items():
            start = at[0]
            at[0] += c.size
            state.counters[name] = self.words[start:at[0]].view(np.float64)
            state.counters[name][:] = c
            self._counters.append((name, start, at[0]))
        self._exemplars = {}  # name -> (start, end) of trace, value, time; the trace's shape
        for name, h in state.histograms.items():
            if h.exemplars:
                spans = ()
                for attr, dtype in zip(_EXEMPLAR_ARRAYS, (np.uint64, np.float64, np.int64)):
                    spans += move(h, attr, dtype)
                self._exemplars[name] = (spans, h.ex_trace.shape)
        self._spare: np.ndarray | None = None  # the last copy, while a snapshot may still use it

    def copy(self, exemplars: bool = True) -> tuple[dict[str, HistogramSnapshot], dict[str, np.ndarray]]:
        """The state's arrays as of now, each a view into one copy of the buffer; `exemplars=False`: without
        the exemplars (most of the buffer's bytes), for a reader that does not show them."""
        end = len(self.words) if exemplars else self.main
        if self._spare is not None and sys.getrefcount(self._spare) == 2:  # no view of the last copy is left
            np.copyto(self._spare[:end], self.words[:end])  # so it is reused: no allocation (or page faults)
        else:
            self._spare = self.words.copy()
        i = self._spare  # counts, ex_time_ns: int64; sums, mins, maxs, ex_value, counters: float64
        f = i.view(np.float64)
        histograms = {}
        for name, bounds, shape, (c0, c1, s0, s1, m0, m1, x0, x1) in self._histograms:
            histograms[name] = HistogramSnapshot(bounds, i[c0:c1].reshape(shape), f[s0:s1], f[m0:m1], f[x0:x1], None)
        if exemplars and self._exemplars:
            u = i.view(np.uint64)  # ex_trace
            for name, ((t0, t1, v0, v1, n0, n1), shape) in self._exemplars.items():
                histograms[name] = histograms[name]._replace(exemplars=(u[t0:t1].reshape(shape), f[v0:v1], i[n0:n1]))
        return histograms, {name: f[start:end] for name, start, end in self._counters}


class HistogramSnapshot(NamedTuple):
    bounds: np.ndarray
    counts: np.ndarray  # [series, buckets], not cumulative
    sums: np.ndarray
    mins: np.ndarray
    maxs: np.ndarray
    exemplars: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # trace [series*nb, 3], value, time


class MetricsSnapshot(NamedTuple):
    histograms: dict[str, HistogramSnapshot]
    counters: dict[str, np.ndarray]
    gauges: dict[str, float | np.ndarray | None]  # an array (per series) for a gauge with dims
