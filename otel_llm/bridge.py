"""Turning aggregates into OTel metric data, and feeding standard MetricReaders.

The OTel Python SDK has no MetricProducer (opentelemetry-python issue 4768),
so pre-aggregated data cannot be registered with a MeterProvider. The
smallest hook that lets every standard reader (PeriodicExportingMetricReader
+ OTLP exporter, InMemoryMetricReader, ...) work unchanged is the reader's own
collect seam: `MetricReader._set_collect_callback`, which the MeterProvider
itself uses. `attach_reader` installs a callback that snapshots the given
Telemetry objects and returns `MetricsData` (cumulative temporality, canonical
names and attributes). If the reader is also registered with a MeterProvider,
that provider's data is merged in.
"""

from __future__ import annotations

import time

import numpy as np
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, MetricsData, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum,
)
from opentelemetry.sdk.metrics._internal.exemplar import Exemplar
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .instruments import (
    CACHE_CONFIG_INFO, CACHE_CONFIG_PREFIX, DIMENSIONS, ENGINE_ATTRIBUTE, MODEL_ATTRIBUTE, PROVIDER_ATTRIBUTE, Instrument,
    Kind,
)

_SCOPE = InstrumentationScope("otel_llm", "0.1.0")
_CUMULATIVE = AggregationTemporality.CUMULATIVE


def _attributes(tel, inst: Instrument, series: int) -> dict:
    attrs = {MODEL_ATTRIBUTE: tel.config.model_name, ENGINE_ATTRIBUTE: tel.config.engine,
             PROVIDER_ATTRIBUTE: tel.config.provider_name}
    if inst.name == CACHE_CONFIG_INFO:
        attrs.update((CACHE_CONFIG_PREFIX + k, v) for k, v in tel.cache_config)
    if inst.dims:
        idx = np.unravel_index(series, [len(DIMENSIONS[d]) for d in inst.dims])
        for d, i in zip(inst.dims, idx):
            attrs[d] = DIMENSIONS[d][int(i)]
    return attrs


def _exemplars(h, series: int) -> list:
    if h.exemplars is None:
        return []
    trace, value, when = h.exemplars
    nb = h.counts.shape[1]
    out = []
    for i in np.nonzero(when[series * nb:(series + 1) * nb])[0].tolist():
        k = series * nb + i
        hi, lo, span = (int(x) for x in trace[k][:3])
        out.append(Exemplar({}, float(value[k]), int(when[k]), span, (hi << 64) | lo))
    return out


def to_metrics(tel) -> list[Metric]:
    """One Telemetry's instruments as OTel `Metric`s (series with no data are skipped)."""
    snap, now, start = tel.snapshot(), time.time_ns(), tel.start_time_ns
    metrics = []
    for name, inst in tel.table_spec.items():
        if inst.kind is Kind.HISTOGRAM:
            h = snap.histograms[name]
            totals = h.counts.sum(axis=1)
            points = [HistogramDataPoint(_attributes(tel, inst, s), start, now, int(totals[s]), float(h.sums[s]),
                                         h.counts[s].tolist(), list(inst.buckets), float(h.mins[s]),
                                         float(h.maxs[s]), _exemplars(h, s))
                      for s in np.nonzero(totals)[0].tolist()]
            data = Histogram(points, _CUMULATIVE)
        elif inst.kind is Kind.COUNTER:
            c = snap.counters[name]
            points = [NumberDataPoint(_attributes(tel, inst, s), start, now, float(c[s])) for s in range(len(c))
                      if c[s] or not inst.dims]
            data = Sum(points, _CUMULATIVE, True)
        else:
            v = snap.gauges.get(name)
            if v is None:
                continue
            points = [NumberDataPoint(_attributes(tel, inst, 0), start, now, float(v))]
            data = Gauge(points)
        if points:
            metrics.append(Metric(name, inst.description, inst.unit, data))
    return metrics


def to_metrics_data(telemetries, resource: Resource | None = None) -> MetricsData:
    metrics = [m for t in telemetries if t.enabled for m in to_metrics(t)]
    return MetricsData([ResourceMetrics(resource or Resource.create({}), [ScopeMetrics(_SCOPE, metrics, "")], "")])


def attach_reader(reader, telemetries, resource: Resource | None = None) -> None:
    """Install the collect callback on `reader` (see module docstring)."""
    provider_collect = reader._collect if getattr(reader, "_collect", None) is not None else None

    def collect(r, timeout_millis: float = 10_000) -> MetricsData:
        ours = to_metrics_data(telemetries, resource)
        if provider_collect is None:
            return ours
        theirs = provider_collect(r, timeout_millis=timeout_millis)
        if theirs is None:
            return ours
        return MetricsData(list(theirs.resource_metrics) + list(ours.resource_metrics))

    reader._set_collect_callback(collect)
