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

Bounded per reader (`cardinality.py`): the first `cardinality_limit` base attribute sets (model,
engine, provider, version) get points of their own; Telemetries beyond fold into points whose
only attribute is `otel.metric.overflow=true`, as do per-adapter counts beyond each
Telemetry's limit. `otel_llm.metric.overflow.measurements{metric}` counts what overflowed.
"""

from __future__ import annotations

import time

import numpy as np
from opentelemetry.sdk.metrics._internal.exemplar import Exemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, MetricsData, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_llm.canonical.cardinality import (
    DEFAULT_CARDINALITY_LIMIT, OVERFLOW, OVERFLOW_ATTRIBUTE, OVERFLOW_HELP, OVERFLOW_INSTRUMENT, CardinalityLimiter,
    fold,
)
from otel_llm.canonical.instruments import (
    ADAPTER_ATTRIBUTE, CACHE_CONFIG_INFO, CACHE_CONFIG_PREFIX, DECLARED_AT_ZERO, DIMENSIONS, ENGINE_ATTRIBUTE,
    KV_BLOCK, LORA_INFO, LORA_REQUESTS, MODEL_ATTRIBUTE, PERF, PROVIDER_ATTRIBUTE, SLO, SPEC_DECODE, Instrument, Kind,
)
from otel_llm.frontend.lora import LoraSnapshot

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
    """One Telemetry's instruments as OTel `Metric`s (series with no data are skipped; the LoRA ones
    are `to_metrics_data`'s)."""
    snap, now, start = tel.snapshot(), time.time_ns(), tel.start_time_ns
    metrics = []
    for name, inst in tel.table_spec.items():
        if name in (LORA_INFO, LORA_REQUESTS):
            continue  # the info gauge is a vLLM exposition artefact: not exported
        if inst.kind is Kind.HISTOGRAM:
            if name.startswith(KV_BLOCK) and not tel.config.kv_cache_metrics:
                continue  # --kv-cache-metrics off: not declared (vLLM's rule)
            h = snap.histograms[name]
            totals = h.counts.sum(axis=1)
            counts, bounds = export_counts(inst, h.counts)
            points = [HistogramDataPoint(_attributes(tel, inst, s), start, now, int(totals[s]), float(h.sums[s]),
                                         counts[s].tolist(), bounds, float(h.mins[s]),
                                         float(h.maxs[s]), _exemplars(h, s))
                      for s in np.nonzero(totals)[0].tolist()]
            data = Histogram(points, _CUMULATIVE)
        elif inst.kind is Kind.COUNTER:
            if name.startswith(SLO) and tel.config.slo is None:
                continue  # goodput: only where objectives are configured
            if name.startswith(PERF) and not tel.config.mfu_metrics:
                continue  # --enable-mfu-metrics off: not declared (vLLM's rule)
            c = snap.counters[name]
            if not c.any() and name.startswith(SPEC_DECODE) and not tel.config.num_speculative_tokens:
                continue  # no speculative decoding here: no zero spec-decode points (vLLM declares none)
            every = not inst.dims or name in DECLARED_AT_ZERO
            points = [NumberDataPoint(_attributes(tel, inst, s), start, now, float(c[s])) for s in range(len(c))
                      if c[s] or every]
            data = Sum(points, _CUMULATIVE, True)
        else:
            v = snap.gauges.get(name)
            if v is None:
                continue
            values = v.tolist() if inst.dims else [v]  # with dims: one value per series
            points = [NumberDataPoint(_attributes(tel, inst, s), start, now, float(x)) for s, x in enumerate(values)]
            data = Gauge(points)
        if points:
            metrics.append(Metric(name, inst.description, inst.unit, data))
    return metrics


class ReaderLimits:
    """One reader's cardinality limit on its Telemetries' base attribute sets, and what it folded."""

    def __init__(self, limit: int | None = None):
        self.limit = limit  # None: the first Telemetry's `cardinality_limit`
        self.bases: CardinalityLimiter | None = None
        self.overflowed: dict[str, int] = {}  # canonical instrument -> measurements folded


def _overflow_metrics(over, now: int, start: int) -> list[Metric]:
    """The Telemetries beyond the limit, folded: one point per instrument, only the overflow attribute."""
    snap, table = fold([t.snapshot() for t in over], [t.table_spec for t in over])
    attrs = {OVERFLOW_ATTRIBUTE: True}
    metrics = []
    for name, inst in table.items():
        if name in (LORA_INFO, LORA_REQUESTS):
            continue
        if inst.kind is Kind.HISTOGRAM:
            h = snap.histograms[name]
            counts, bounds = export_counts(inst, h.counts)
            total = counts.sum(axis=0)
            n = int(total.sum())
            data = Histogram([HistogramDataPoint(attrs, start, now, n, float(h.sums.sum()), total.tolist(), bounds,
                                                 float(h.mins.min()), float(h.maxs.max()), [])] if n else [],
                             _CUMULATIVE)
        elif inst.kind is Kind.COUNTER:
            v = float(snap.counters[name].sum())
            data = Sum([NumberDataPoint(attrs, start, now, v)] if v or not inst.dims else [], _CUMULATIVE, True)
        else:
            v = snap.gauges.get(name)
            data = Gauge([NumberDataPoint(attrs, start, now, float(np.sum(v)))] if v is not None else [])
        if data.data_points:
            metrics.append(Metric(name, inst.description, inst.unit, data))
    return metrics


def _lora_requests(own, over, loras: dict[int, LoraSnapshot | None], now: int) -> Metric | None:
    """`otel_llm.lora.requests`: per adapter of each Telemetry with its own points, and one overflow
    point for adapters beyond a Telemetry's limit and every adapter of the folded Telemetries."""
    points, overflow = [], 0
    for t in own:
        lora = loras[id(t)]
        if lora is not None:
            base = _attributes(t, t.table_spec[LORA_REQUESTS], 0)
            points += [NumberDataPoint({**base, ADAPTER_ATTRIBUTE: a}, t.start_time_ns, now, float(c))
                       for a, c in lora.requests]
            overflow += lora.requests_overflow
    for t in over:
        lora = loras[id(t)]
        if lora is not None:
            overflow += lora.requests_overflow + sum(c for _, c in lora.requests)
    if overflow:
        start = min(t.start_time_ns for t in (*own, *over))
        points.append(NumberDataPoint({OVERFLOW_ATTRIBUTE: True}, start, now, float(overflow)))
    if not points:
        return None
    inst = (own or over)[0].table_spec[LORA_REQUESTS]
    return Metric(LORA_REQUESTS, inst.description, inst.unit, Sum(points, _CUMULATIVE, True))


def to_metrics_data(telemetries, resource: Resource | None = None, limits: ReaderLimits | None = None,
                    producers=()) -> MetricsData:
    """The Telemetries' metrics, bounded by `limits` (a reader's; default: a fresh one), then those of
    `producers` (callables returning OTel `Metric`s of the same scope, e.g. `PipelineTelemetry.to_metrics`)."""
    tels = [t for t in telemetries if t.enabled]
    limits = limits or ReaderLimits()
    if limits.bases is None:
        limits.bases = CardinalityLimiter(limits.limit or (tels[0].config.cardinality_limit if tels
                                                           else DEFAULT_CARDINALITY_LIMIT))
    own, over = [], []
    for t in tels:
        c = t.config
        key = (c.model_name, c.engine, c.provider_name, c.model_version)
        (over if limits.bases.slot(key, 0) == OVERFLOW else own).append(t)
    loras = {id(t): getattr(t, "lora_snapshot", lambda: None)() for t in tels}
    metrics = [m for t in own for m in to_metrics(t)]
    now, start = time.time_ns(), min((t.start_time_ns for t in tels), default=0)
    counts = limits.overflowed
    if over:
        metrics += _overflow_metrics(over, now, start)
        for name in over[0].table_spec:
            if name not in (LORA_INFO, LORA_REQUESTS):
                counts[name] = counts.get(name, 0) + len(over)  # each one's observation, once per collection
    lora = _lora_requests(own, over, loras, now)
    if lora is not None:
        metrics.append(lora)
    measured = dict(counts)
    for lo in loras.values():
        if lo is not None:
            for name, v in lo.overflowed.items():
                measured[name] = measured.get(name, 0) + v
    points = [NumberDataPoint({"metric": name}, start, now, float(v)) for name, v in sorted(measured.items()) if v]
    if points:
        metrics.append(Metric(OVERFLOW_INSTRUMENT, OVERFLOW_HELP, "{measurement}", Sum(points, _CUMULATIVE, True)))
    for produce in producers:
        metrics += produce()
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


def attach_reader(reader, telemetries, resource: Resource | None = None, temporality: str = "cumulative",
                  producers=()) -> None:
    """Install the collect callback on `reader` (see module docstring). `temporality`: one of TEMPORALITIES
    (lowmemory, as in the OTel SDK, is delta for counters and histograms); `producers`: see `to_metrics_data`."""
    if temporality not in TEMPORALITIES:
        raise ValueError(f"temporality must be one of {TEMPORALITIES}, got {temporality!r}")
    provider_collect = reader._collect if getattr(reader, "_collect", None) is not None else None
    delta = DeltaState() if temporality != "cumulative" else None
    limits = ReaderLimits()

    def collect(r, timeout_millis: float = 10_000) -> MetricsData:
        ours = to_metrics_data(telemetries, resource, limits, producers)
        if delta is not None:
            ours = delta.apply(ours)
        if provider_collect is None:
            return ours
        theirs = provider_collect(r, timeout_millis=timeout_millis)
        if theirs is None:
            return ours
        return MetricsData(list(theirs.resource_metrics) + list(ours.resource_metrics))

    reader._set_collect_callback(collect)
