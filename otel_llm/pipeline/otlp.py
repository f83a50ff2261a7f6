"""A pipeline's families as OTel metrics: what a `MetricReader` (OTLP) collects of a `PipelineTelemetry`.

Each family is its OTel instrument (`PipelineFamily.otel`, `unit`, the family's HELP as its
description), each series a point whose attributes are its labels' (`families.ATTRIBUTES`);
the overflow series' only attribute is `otel.metric.overflow=true`, as the SDK's other instruments
write it. Counters are cumulative monotonic sums, histograms carry the family's bounds, counts and
sum (no min and max: the families do not keep them), gauges their value at the read.
"""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum,
)

from otel_llm.canonical.cardinality import OVERFLOW_ATTRIBUTE, OVERFLOW_LABEL
from otel_llm.canonical.instruments import Kind
from otel_llm.pipeline.families import ATTRIBUTES
from otel_llm.pipeline.series import SeriesSnapshot


def _attributes(pairs) -> dict:
    if pairs == (OVERFLOW_LABEL,):
        return {OVERFLOW_ATTRIBUTE: True}
    return {ATTRIBUTES[label]: value for label, value in pairs}


def to_metrics(snaps: list[SeriesSnapshot], start_ns: int, now_ns: int) -> list[Metric]:
    """The families that have series, as OTel `Metric`s."""
    out = []
    for snap in snaps:
        if not snap.rows:
            continue
        fam = snap.family
        if fam.kind is Kind.HISTOGRAM:
            bounds = [float(b) for b in fam.buckets]
            data = Histogram([HistogramDataPoint(_attributes(pairs), start_ns, now_ns, sum(counts), float(total),
                                                 list(counts), bounds, None, None, [])
                              for pairs, (counts, total) in snap.rows], AggregationTemporality.CUMULATIVE)
        else:
            points = [NumberDataPoint(_attributes(pairs), start_ns, now_ns, float(value)) for pairs, value in snap.rows]
            data = Sum(points, AggregationTemporality.CUMULATIVE, True) if fam.kind is Kind.COUNTER else Gauge(points)
        out.append(Metric(fam.otel, fam.help, fam.unit, data))
    return out
