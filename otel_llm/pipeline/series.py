"""Labelled series of one pipeline family, bounded, and their exposition lines.

A `SeriesSet` holds a family's series by label values: a float (counter, gauge) or bucket
counts and a sum (histogram, buckets as Prometheus `le`: value <= bound). A series exists
once something was recorded for it (or it was created up front with `touch`). Label values
come from outside (stage and replica names, finish and skip reasons), so a set admits at most
`limit` distinct ones (`cardinality.CardinalityLimiter`); measurements for more go into one
series labelled only `otel_metric_overflow="true"`, and `overflowed` counts them.

Thread-safety: none; the owner (`PipelineTelemetry`) holds its lock around every call, and
renders from `snapshot()`, an immutable copy, off the lock.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

import numpy as np

from otel_llm.canonical.cardinality import OVERFLOW, OVERFLOW_LABEL, CardinalityLimiter
from otel_llm.canonical.instruments import Kind
from otel_llm.export.exposition import family_header, format_value, label_text
from otel_llm.pipeline.families import PipelineFamily


class SeriesSnapshot(NamedTuple):
    """One family's series at one moment: rows of (label pairs, value) or (label pairs, (bucket counts, sum))."""

    name: str
    family: PipelineFamily
    rows: tuple


class SeriesSet:
    def __init__(self, family: PipelineFamily, name: str, limit: int):
        self.family = family
        self.name = name  # the exposed family name (prefix + stem)
        self._limiter = CardinalityLimiter(limit)
        self._series: dict[tuple[str, ...] | None, list] = {}  # None: the overflow series
        self._histogram = family.kind is Kind.HISTOGRAM

    @property
    def overflowed(self) -> int:
        return self._limiter.overflowed

    def _cell(self, values: tuple[str, ...]) -> list:
        key = values if self._limiter.slot(values) != OVERFLOW else None
        cell = self._series.get(key)
        if cell is None:
            cell = self._series[key] = [[0] * (len(self.family.buckets) + 1), 0.0] if self._histogram else [0.0]
        return cell

    def touch(self, values: tuple[str, ...]) -> None:
        """Create the series (value 0) before it has data, as a pre-created prometheus_client child."""
        self._cell(values)

    def add(self, values: tuple[str, ...], amount: float) -> None:
        """Counter: add `amount` (>= 0, checked by the caller)."""
        self._cell(values)[0] += amount

    def set(self, values: tuple[str, ...], value: float) -> None:
        """Gauge: set the value."""
        self._cell(values)[0] = value

    def observe(self, values: tuple[str, ...], value: float) -> None:
        """Histogram: one observation (finite, checked by the caller)."""
        counts, _ = cell = self._cell(values)
        counts[bisect_left(self.family.buckets, value)] += 1
        cell[1] += value

    def observe_many(self, values: tuple[str, ...], observed: np.ndarray) -> None:
        """Histogram: many observations of one series at once (finite, checked by the caller)."""
        counts, _ = cell = self._cell(values)
        bins = np.bincount(np.searchsorted(self.family.buckets, observed, side="left"),
                           minlength=len(counts)).tolist()
        for i, n in enumerate(bins):
            counts[i] += n
        cell[1] += float(observed.sum())

    def snapshot(self) -> SeriesSnapshot:
        labels = self.family.labels
        rows = []
        for key, cell in self._series.items():
            pairs = (OVERFLOW_LABEL,) if key is None else tuple(zip(labels, key))
            rows.append((pairs, (tuple(cell[0]), cell[1]) if self._histogram else cell[0]))
        return SeriesSnapshot(self.name, self.family, tuple(rows))


def series_lines(lines: list[str], snap: SeriesSnapshot, openmetrics: bool, otel: bool = False) -> None:
    """The family in text format 0.0.4 or OpenMetrics (no `# EOF`); nothing when it has no series.
    `otel`: under its OTel instrument's name and attributes, as the OTel Prometheus rules write them."""
    if not snap.rows:
        return
    fam, name = snap.family, snap.name
    rows = snap.rows
    if otel:
        name, labels = fam.exposed(otel=True)
        rows = [(pairs if pairs == (OVERFLOW_LABEL,) else tuple(zip(labels, (v for _, v in pairs))), value)
                for pairs, value in rows]
    family_header(lines, name, fam.kind, fam.help, openmetrics)
    if fam.kind is Kind.HISTOGRAM:
        bounds = [format_value(b) for b in fam.buckets] + ["+Inf"]
        for pairs, (counts, total) in rows:
            lab = label_text(pairs)
            sep = "," if lab else ""
            cum = 0
            for le, c in zip(bounds, counts):
                cum += c
                lines.append(f'{name}_bucket{{{lab}{sep}le="{le}"}} {cum}')
            braced = f"{{{lab}}}" if lab else ""
            lines.append(f"{name}_sum{braced} {format_value(total)}")
            lines.append(f"{name}_count{braced} {cum}")
        return
    sample = name + ("_total" if fam.kind is Kind.COUNTER else "")
    for pairs, value in rows:
        lab = label_text(pairs)
        lines.append(f"{sample}{{{lab}}} {format_value(value)}" if lab else f"{sample} {format_value(value)}")
