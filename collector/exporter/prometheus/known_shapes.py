"""A sender's export of a known shape applied without parsing it: the store's fast path.

The store learns a sender's export shape (`metrics_layout.Layout`) from an export it took in
full with nothing refused, and binds each point of it to the input series that export's points
landed in (`MetricStore._bind`). The sender's next export, when it has the same shape, is applied
from its unpacked values by `Shape.apply`, which does to each series what the full path's loops
(`MetricStore._number_points`, `_histogram_points`) do to it for the same point: the same
comparisons, in the same order, with the same values. Only cumulative sums and histograms and
gauges are bound (delta points are added and checked against each other: they take the full path).

Exemplars are made from the values when first read (`LaidOutExemplars`): only OpenMetrics scrapes
and remote-write read them.

When a shape is learnt: from a sender's export the full path took with nothing refused (its first
resource is the sender's key), not its first (a one-off sender never pays for it). A shape that
paid for itself (`_PAYBACK` hits per miss) is learnt again at its first miss; otherwise after
`1 << backoff` misses, `backoff` counting the shapes in a row that did not pay (at most 6: a
sender whose exports never keep their shape costs a layout walk every 64 exports). The store
forgets every shape when it removes a series or a resource or re-plans a metric (what a shape
binds may be gone), and when it holds `MAX_SHAPES` senders' or `MAX_BYTES` of payloads.
"""

from __future__ import annotations

from operator import itemgetter

from otel_llm.collector.pdata.metrics_layout import Layout

MAX_BYTES = 128 << 20  # the layouts' payload bytes held, in all
MAX_SHAPES = 65536  # senders
_PAYBACK = 16  # hits per miss that pay for learning a shape (a layout walk costs about 8 full ingests)
_MAX_BACKOFF = 6


class LaidOutExemplars:
    """A histogram point's exemplars, (trace_id, span_id, as_double, as_int, time_unix_nano) tuples made
    from its export's bytes when first read (only OpenMetrics scrapes and remote-write read them).
    Never empty."""

    __slots__ = ("_export", "_getters", "_made")

    def __init__(self, export: _Export, getters: tuple[itemgetter, ...]) -> None:
        self._export, self._getters, self._made = export, getters, None

    def __iter__(self):
        if self._made is None:
            values = self._export.exemplar_values()
            self._made = [get(values) for get in self._getters]
            self._export = None
        return iter(self._made)

    def __len__(self) -> int:
        return len(self._getters)


class _Export:
    """One export's bytes, its exemplars' fields unpacked once, for all of its points, when first read."""

    __slots__ = ("_layout", "_payload", "_values")

    def __init__(self, layout: Layout, payload: bytes) -> None:
        self._layout, self._payload, self._values = layout, payload, None

    def exemplar_values(self) -> tuple:
        if self._values is None:
            self._values = self._layout.exemplar_values(self._payload)
            self._payload = None
        return self._values


def exemplar_getters(indexes: tuple[tuple[int, ...], ...]) -> tuple[itemgetter, ...]:
    """A `Layout`'s exemplar indexes (`HistogramPoint.exemplars`) as `LaidOutExemplars` reads them."""
    return tuple(itemgetter(*e) for e in indexes)


class Shape:
    """One sender's last learnt shape: its layout bound to series (None when it could not be), and
    when to learn again."""

    __slots__ = ("layout", "resources", "seen", "numbers", "histograms", "hits", "misses", "backoff")

    def __init__(self, layout: Layout | None, bound: tuple | None, backoff: int) -> None:
        self.layout = layout if bound is not None else None
        self.resources, self.seen, self.numbers, self.histograms = bound or ((), (), (), ())
        self.hits = self.misses = 0
        self.backoff = backoff

    def due(self) -> bool:
        """A miss: -> whether to learn the sender's shape from this export."""
        self.misses += 1
        return self._paid() or self.misses >= 1 << self.backoff

    def next_backoff(self) -> int:
        return 0 if self._paid() else min(self.backoff + 1, _MAX_BACKOFF)

    def _paid(self) -> bool:
        return self.hits >= _PAYBACK * self.misses

    def apply(self, payload: bytes, values: tuple, now: float) -> int:
        """Apply one export of this shape (`values`: its `Layout.values`); -> the points accepted (all of them)."""
        export = _Export(self.layout, payload)
        for resource in self.resources:
            resource.seen_s = now
        for s in self.seen:  # points flagged "no recorded value"
            s.seen_s = now
        for s, start, time, value in self.numbers:
            s.seen_s = now
            t, begin = values[time], values[start]
            if t >= s.time_ns or begin != s.start_ns:  # newer, or the sender restarted
                s.value, s.start_ns, s.time_ns = values[value] or 0, begin, t  # (as `as_double or as_int`)
        for s, start, time, count, total, counts, exemplars in self.histograms:
            s.seen_s = now
            t, begin = values[time], values[start]
            restart = begin != s.start_ns
            if t < s.time_ns and not restart:
                continue  # older than what we have
            s.counts, s.count, s.sum, s.start_ns = values[counts], values[count], values[total], begin
            if exemplars:
                s.exemplars = LaidOutExemplars(export, exemplars)
            elif restart:
                s.exemplars = None
            s.time_ns = t
        self.hits += 1
        return self.layout.num_points
