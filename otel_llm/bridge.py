"""Turning aggregates into OTel metric data, and feeding standard MetricReaders.

The OTel Python SDK has no MetricProducer (opentelemetry-python issue 4768),
so pre-aggregated data cannot be registered with a MeterProvider. The
smallest hook that lets every standard reader (PeriodicExportingMetricReader
+ OTLP exporter, InMemoryMetricReader, ...) work unchanged is the reader's own
collect seam: `MetricReader._set_collect_callback`, which the MeterProvider
itself uses. `attach_reader` installs a callback that snapshots the given
Telemetry objects and returns `MetricsData` (cumulative temporality, canonical
names and attributes). If the reader is also registered with a MeterProvider,
that provider's data is merged in. With `temporality="delta"` counters and
histograms carry what changed since the reader's previous collection
(`DeltaState`), for backends that want deltas.
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
_DELTA = AggregationTemporality.DELTA
TEMPORALITIES = ("cumulative", "delta", "lowmemory")  # OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE


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


def export_counts(inst: Instrument, counts: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """Per-series bucket counts on the instrument's OTLP bounds (a subset of the ones it aggregates
    on, which every profile's buckets join): adjacent fine buckets summed, exactly."""
    if inst.export_buckets is None or inst.export_buckets == inst.buckets:
        return counts, list(inst.buckets)
    edges = np.searchsorted(np.asarray(inst.buckets, np.float64), np.asarray(inst.export_buckets, np.float64))
    cum = np.cumsum(counts, axis=1)[:, np.append(edges, counts.shape[1] - 1)]
    return np.diff(cum, axis=1, prepend=0), list(inst.export_buckets)


def to_metrics(tel) -> list[Metric]:
    """One Telemetry's instruments as OTel `Metric`s (series with no data are skipped)."""
    snap, now, start = tel.snapshot(), time.time_ns(), tel.start_time_ns
    metrics = []
    for name, inst in tel.table_spec.items():
        if inst.kind is Kind.HISTOGRAM:
            h = snap.histograms[name]
            totals = h.counts.sum(axis=1)
            counts, bounds = export_counts(inst, h.counts)
            points = [HistogramDataPoint(_attributes(tel, inst, s), start, now, int(totals[s]), float(h.sums[s]),
                                         counts[s].tolist(), bounds, float(h.mins[s]),
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


class DeltaState:
    """Turns one reader's cumulative points into deltas since its previous collection."""

    def __init__(self):
        self._last: dict[tuple, object] = {}  # (metric name, attributes) -> previous cumulative point

    def apply(self, data: MetricsData) -> MetricsData:
        out_rm = []
        for rm in data.resource_metrics:
            out_sm = []
            for sm in rm.scope_metrics:
                metrics = []
                for m in sm.metrics:
                    if isinstance(m.data, (Sum, Histogram)):
                        points = [self._delta(m.name, p) for p in m.data.data_points]
                        data_ = Sum(points, _DELTA, True) if isinstance(m.data, Sum) else Histogram(points, _DELTA)
                        m = Metric(m.name, m.description, m.unit, data_)
                    metrics.append(m)
                out_sm.append(ScopeMetrics(sm.scope, metrics, sm.schema_url))
            out_rm.append(ResourceMetrics(rm.resource, out_sm, rm.schema_url))
        return MetricsData(out_rm)

    def _delta(self, name: str, p):
        key = (name, tuple(sorted(p.attributes.items())))
        prev = self._last.get(key)
        self._last[key] = p
        start = p.start_time_unix_nano if prev is None else prev.time_unix_nano
        if isinstance(p, NumberDataPoint):
            return NumberDataPoint(p.attributes, start, p.time_unix_nano, p.value - (prev.value if prev else 0))
        if prev is None:
            return p
        counts = [a - b for a, b in zip(p.bucket_counts, prev.bucket_counts)]
        # min/max of the interval alone are unknown: kept only when the interval holds every value
        same = prev.count == 0
        return HistogramDataPoint(p.attributes, start, p.time_unix_nano, p.count - prev.count, p.sum - prev.sum,
                                  counts, p.explicit_bounds, p.min if same else None, p.max if same else None,
                                  p.exemplars)


def attach_reader(reader, telemetries, resource: Resource | None = None, temporality: str = "cumulative") -> None:
    """Install the collect callback on `reader` (see module docstring). `temporality`: one of TEMPORALITIES
    (lowmemory, as in the OTel SDK, is delta for counters and histograms)."""
    if temporality not in TEMPORALITIES:
        raise ValueError(f"temporality must be one of {TEMPORALITIES}, got {temporality!r}")
    provider_collect = reader._collect if getattr(reader, "_collect", None) is not None else None
    delta = DeltaState() if temporality != "cumulative" else None

    def collect(r, timeout_millis: float = 10_000) -> MetricsData:
        ours = to_metrics_data(telemetries, resource)
        if delta is not None:
            ours = delta.apply(ours)
        if provider_collect is None:
            return ours
        theirs = provider_collect(r, timeout_millis=timeout_millis)
        if theirs is None:
            return ours
        return MetricsData(list(theirs.resource_metrics) + list(ours.resource_metrics))

    reader._set_collect_callback(collect)
