"""One source's numbers for a render in a few numpy calls, not several per series.

A /metrics render writes, for each histogram series a family shows, its cumulative counts at the
family's bounds (`le`, each the last of the fine buckets it covers), its count and its sum, and for
each counter series its value, the series summed where the family drops a label. Read series by
series that is a reduce over the summed series, an accumulate, a gather and a `tolist`, each
~0.3-1.5 us of numpy set-up: ~0.7 ms of a vLLM-scale render (8 engines), more than formatting the
lines. A `RenderPlan`, made once per source and cached with its line prefixes, lays every value
out in order:

- the values are read from one buffer of 8-byte words: a Telemetry's snapshot is a copy of its
  state's (`MetricsSnapshot.words`), read in place; a folded one's arrays are concatenated into one;
- the counts are gathered bucket-major per shown series (fine bucket 0 of each summed series, then
  bucket 1, ...) after one 0, so one cumulative sum holds every cumulative count: an entry's count up
  to fine bucket `j` is the sum at its `j`th row's last element less the sum just before the entry
  (exact: integers);
- histogram sums and counter values are gathered per entry and added with one `reduceat` each
  (one series' value exactly as stored; several added in series order).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from otel_llm.canonical.metrics_state import MetricsSnapshot

_NONE = np.zeros(0, np.intp)


class RenderPlan:
    """Where each value one source shows comes from. `histograms`: per shown histogram series in
    render order, (instrument name, number of series, fine buckets incl. +Inf, the series it sums: an
    int, a slice or an index array, the fine bucket each shown bucket ends at); `counters`: per shown
    counter series in render order, (instrument name, number of series, the series it sums)."""

    __slots__ = ("_histograms", "_counters", "_hi", "_lo", "_gathers")

    def __init__(self, histograms: list[tuple[str, int, int, object, np.ndarray]],
                 counters: list[tuple[str, int, object]]):
        self._histograms, self._counters = histograms, counters
        hi, lo = [], []
        used = 1  # gathered counts, the leading 0 first
        for _, num_series, nb, series, ends in histograms:
            n = len(_rows(series, num_series))
            hi.append(used - 1 + (np.asarray(ends) + 1) * n)
            lo.append(np.full(len(ends), used - 1))
            used += n * nb
        self._hi, self._lo = (np.concatenate(x) if x else _NONE for x in (hi, lo))
        self._gathers: tuple | None = None  # (a buffer's layout, the positions of the values in it)

    def numbers(self, snapshot: MetricsSnapshot) -> tuple[list[int], list[float], list[float]]:
        """Every histogram entry's cumulative counts at its shown bounds, in order; every histogram
        entry's sum; every counter entry's value: of `snapshot`."""
        words, layout = snapshot.words if snapshot.words is not None else self._concatenated(snapshot)
        if self._gathers is None or self._gathers[0] != layout:
            self._gathers = (layout, _Gathers(self._histograms, self._counters, layout))
        g = self._gathers[1]
        gathered = np.empty(len(g.counts) + 1, np.int64)  # a leading 0, then the counts (per call: thread-safe)
        gathered[0] = 0
        np.take(words, g.counts, out=gathered[1:])
        cumulative = np.add.accumulate(gathered)
        f = words.view(np.float64)
        return ((cumulative[self._hi] - cumulative[self._lo]).tolist(),
                np.add.reduceat(f[g.sums], g.sum_starts).tolist() if len(g.sum_starts) else [],
                np.add.reduceat(f[g.counters], g.counter_starts).tolist() if len(g.counter_starts) else [])

    def _concatenated(self, snapshot: MetricsSnapshot) -> tuple[np.ndarray, _Layout]:
        """The arrays of a snapshot without a buffer (a folded one) in one, and where each is."""
        hist = snapshot.histograms
        names = list(dict.fromkeys(name for name, *_ in self._histograms))
        counters = list(dict.fromkeys(name for name, *_ in self._counters))
        arrays = [*(hist[n].counts for n in names), *(hist[n].sums for n in names),
                  *(snapshot.counters[n] for n in counters)]
        starts = np.cumsum([0] + [a.size for a in arrays]).tolist()
        k = len(names)
        layout = _Layout(tuple((n, starts[i], starts[k + i]) for i, n in enumerate(names)),
                         tuple((n, starts[2 * k + i]) for i, n in enumerate(counters)))
        words = np.concatenate([np.ascontiguousarray(a).ravel().view(np.int64) for a in arrays]) if arrays else _NONE
        return words, layout


class _Layout(NamedTuple):
    """Where a concatenation (`RenderPlan._concatenated`) holds each array: a buffer layout as a
    state's `_Arena` is one, compared by value (a folded source's arrays keep their places)."""

    histograms: tuple[tuple[str, int, int], ...]  # (name, counts' start, sums' start)
    counters: tuple[tuple[str, int], ...]

    def histogram_at(self, name: str) -> tuple[int, int]:
        return next((c, s) for n, c, s in self.histograms if n == name)

    def counter_at(self, name: str) -> int:
        return next(c for n, c in self.counters if n == name)


class _Gathers:
    """A `RenderPlan`'s values as positions in one buffer layout (`_Layout`, `metrics_state._Arena`)."""

    def __init__(self, histograms, counters, layout):
        counts, sums = [], []
        for name, num_series, nb, series, _ in histograms:
            c0, s0 = layout.histogram_at(name)
            rows = _rows(series, num_series)
            counts.append((c0 + rows[None, :] * nb + np.arange(nb)[:, None]).ravel())  # [bucket, series]
            sums.append(s0 + rows)
        self.counts = np.concatenate(counts) if counts else _NONE
        self.sums, self.sum_starts = _segments(sums)
        self.counters, self.counter_starts = _segments([layout.counter_at(name) + _rows(series, num_series)
                                                        for name, num_series, series in counters])


def _rows(series, num_series: int) -> np.ndarray:
    return np.array([series]) if isinstance(series, int) else np.arange(num_series)[series]


def _segments(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """`parts` concatenated, and where each starts (`reduceat`'s indices)."""
    starts = np.cumsum([0] + [len(p) for p in parts[:-1]]).astype(np.intp) if parts else _NONE
    return (np.concatenate(parts) if parts else _NONE), starts
