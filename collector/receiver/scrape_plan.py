"""How an exposition's families become OTLP: a `Plan` built once per shape, filled with each scrape's values.

Families a profile knows (vLLM's names first, then otel-llm's `otel` names) become their
canonical instrument again: the profile's model and engine labels and the per-request labels
it exposes go back to their attributes (only where the profile's value map is the identity, so
the reverse is exact), so the collector re-serves them under any `--metrics-compat` profile.
Every other family keeps its own name (the collector's router passes the scrape scope's metrics
through verbatim): counters (samples ending in `_total`) and histograms as such, everything else
(gauges, summaries' quantiles, `_sum` and `_count`, info, untyped) as gauges named by their samples.

Cumulative semantics: a counter's or histogram's start time is its `_created` sample when the
target has one (in the family in OpenMetrics; a gauge family of its own in text 0.0.4: read, not
re-served), else the converter's first sight of the series, renewed when a value goes down (a
restarted target).

What depends only on the families' names, types, help and label sets (the metrics, each point's
attributes, a histogram's bucket order and bounds) is built once, into a request whose points
have no values yet; each value is named by its sample's index in the exposition (`values[i]`:
the i-th sample, families in order). `fill` then writes one scrape's values, start times and
bucket counts into those points, in the order the conversion has always taken, so the errors a
scrape's values cause (buckets not cumulative, a count that is not a number) are raised as
before, and an error the families cause is raised at its family's turn (`_Raise`).

Size: one noun, the plan, and what it is made of: what a family becomes (`_family`) and how its
points are filled (`_Numbers`, `_Counters`, `_Histogram`) mirror each other step for step, which
is what keeps a plan's output and errors those of the conversion; they stay side by side.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from operator import itemgetter
from typing import NamedTuple

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_llm.canonical.instruments import (
    CACHE_CONFIG_INFO, CACHE_CONFIG_PREFIX, DIMENSIONS, ENGINE_ATTRIBUTE, MODEL_ATTRIBUTE, Kind, instrument_table,
)
from otel_llm.collector.processor.metric_routes import SCRAPE_SCOPE as SCOPE
from otel_llm.shim.profiles import get_profile

REVERSED_PROFILES = ("vllm", "otel")  # first wins on a name both know (none today)
_CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
_TYPE_KIND = {"counter": Kind.COUNTER, "gauge": Kind.GAUGE, "histogram": Kind.HISTOGRAM}


class ScrapeError(ValueError):
    """The exposition cannot be taken: `reason` is a short label value (self-metrics), the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Reverse(NamedTuple):
    """How an exposed family goes back to its canonical instrument."""

    instrument: str
    kind: Kind
    labels: dict[str, str]  # exposed label -> attribute


def reverse_table() -> dict[str, Reverse]:
    """Exposed family name -> canonical instrument, from the profile tables themselves."""
    table = instrument_table(8192)
    out: dict[str, Reverse] = {}
    for profile in map(get_profile, REVERSED_PROFILES):
        for fam in profile.families:
            inst = table[fam.canonical]
            labels = {profile.model_label: MODEL_ATTRIBUTE, profile.engine_label: ENGINE_ATTRIBUTE}
            exact = True
            for dim, (label, vmap) in fam.labels.items():
                exact &= all(vmap(v) == v for v in DIMENSIONS[dim])
                labels[label] = dim
            if exact and fam.name not in out:
                out[fam.name] = Reverse(inst.name, inst.kind, labels)
    return out


_REVERSE = reverse_table()


def request_for(resource: Resource):
    """An empty request for one target: (request, its one ScopeMetrics)."""
    request = ExportMetricsServiceRequest()
    sm = request.resource_metrics.add(resource=resource).scope_metrics.add(scope=InstrumentationScope(name=SCOPE))
    return request, sm


def add_gauges(sm, values: dict[str, float], now_ns: int) -> None:
    for name, value in values.items():
        _gauge(sm, name).gauge.data_points.add(time_unix_nano=now_ns, as_double=value)


class Starts(NamedTuple):
    """A scrape's cumulative start times: the last scrape's (series -> (start ns, value)), the
    converter's first scrape, and this scrape's, filled in (only the series still there)."""

    previous: dict[tuple, tuple[int, float]]
    first_ns: int
    now: dict[tuple, tuple[int, float]]

    def start(self, key: tuple, created: float | None, value: float, now_ns: int) -> int:
        if created is not None:
            start = round(created * 1e9)
        else:
            start, last = self.previous.get(key, (self.first_ns, value))
            if value < last:  # went down: the target restarted
                start = now_ns
        self.now[key] = (start, value)
        return start


class Plan:
    """One exposition shape's request (every metric and point, no values) and the steps that fill it.
    `samples`: the exposition's sample count. Not thread-safe: one converter's."""

    def __init__(self, resource: Resource, families: list) -> None:
        self.request, self._sm = request_for(resource)
        self._steps: list = []
        self.samples = sum(len(fam.samples) for fam in families)
        try:
            self._build(families)
        except Exception as exc:  # raised at this family's turn in every fill, as the conversion raised it
            self._steps.append(_Raise(exc))

    def fill(self, values: list, now_ns: int, starts: Starts) -> None:
        """Write one scrape's values (`values[i]`: the i-th sample's) into the request. Raises what
        the conversion raises (ScrapeError, or ValueError and the like for the caller to report)."""
        for step in self._steps:
            step.fill(values, now_ns, starts)

    def serialize(self, extra: dict[str, float], now_ns: int) -> bytes:
        """The filled request with the `extra` gauges after the exposition's metrics."""
        metrics = self._sm.metrics
        n = len(metrics)
        add_gauges(self._sm, extra, now_ns)
        try:
            return self.request.SerializeToString()
        finally:
            del metrics[n:]

    # -- building: what does not depend on values ---------------------------------------------

    def _build(self, families: list) -> None:
        bases, base = [], 0  # each family's first sample's index
        for fam in families:
            bases.append(base)
            base += len(fam.samples)
        types = {fam.name: fam.type for fam in families}
        created = {}  # text 0.0.4 writes a counter's or histogram's `_created` as a gauge family of its own
        for fam, base in zip(families, bases):
            if fam.name.endswith("_created") and types.get(fam.name[:-8]) in ("counter", "histogram"):
                created[fam.name[:-8]] = {_key(s.labels): base + i for i, s in enumerate(fam.samples)}
        for fam, base in zip(families, bases):
            if not (fam.name.endswith("_created") and fam.name[:-8] in created):  # those are start times
                self._family(fam, base, created.get(fam.name, {}))

    def _family(self, fam, base: int, created: dict) -> None:
        sm = self._sm
        kind = _TYPE_KIND.get(fam.type)
        rev = _REVERSE.get(fam.name)
        if rev is not None and rev.kind is kind:
            name, to_attrs = rev.instrument, _canonical_attributes(rev)
        else:
            name, to_attrs = fam.name, _label_attributes
            if kind is Kind.COUNTER and not all(s.name in (fam.name + "_total", fam.name + "_created")
                                                for s in fam.samples):
                kind = None  # a counter without `_total` keeps its sample name, as a gauge
        created_name = fam.name + "_created"
        created = {**created, **{_key(s.labels): base + i for i, s in enumerate(fam.samples)
                                 if s.name == created_name}}
        if kind is Kind.HISTOGRAM:
            self._histograms(name, fam, base, to_attrs, created)
        elif kind is Kind.COUNTER:
            metric = sm.metrics.add(name=name, description=fam.documentation)
            metric.sum.aggregation_temporality = _CUMULATIVE
            metric.sum.is_monotonic = True
            self._steps.append(_Counters([
                (_point(metric.sum.data_points, to_attrs(s.labels)), (fam.name, _key(s.labels)), base + i,
                 created.get(_key(s.labels))) for i, s in enumerate(fam.samples) if s.name != created_name]))
        elif kind is Kind.GAUGE and name != fam.name:  # a canonical gauge
            metric = _gauge(sm, name, fam.documentation)
            self._steps.append(_Numbers([(_point(metric.gauge.data_points, to_attrs(s.labels)), base + i)
                                         for i, s in enumerate(fam.samples)]))
        else:  # everything else by sample name: gauges, summaries, info, untyped
            by_name: dict[str, metrics_pb2.Metric] = {}
            points = []
            for i, s in enumerate(fam.samples):
                if s.name == created_name:  # a start time (OpenMetrics)
                    continue
                metric = by_name.get(s.name)
                if metric is None:
                    metric = by_name[s.name] = _gauge(sm, s.name, fam.documentation)
                points.append((_point(metric.gauge.data_points, to_attrs(s.labels)), base + i))
            self._steps.append(_Numbers(points))

    def _histograms(self, name: str, fam, base: int, to_attrs, created: dict) -> None:
        series: dict[tuple, dict] = {}
        for i, s in enumerate(fam.samples):
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            h = series.setdefault(_key(labels), {"labels": labels, "buckets": []})
            suffix = s.name[len(fam.name):]
            if suffix == "_bucket":
                h["buckets"].append((float(s.labels["le"]), base + i))
            elif suffix in ("_count", "_sum"):
                h[suffix] = base + i
        metric = self._sm.metrics.add(name=name, description=fam.documentation)
        metric.histogram.aggregation_temporality = _CUMULATIVE
        for key, h in series.items():
            self._steps.append(_Histogram(
                _point(metric.histogram.data_points, to_attrs(h["labels"])), (fam.name, key),
                f"histogram {fam.name}{dict(h['labels'])}", h["buckets"], h.get("_count"), h.get("_sum"),
                created.get(key)))


# -- filling: one scrape's values ---------------------------------------------------------------


class _Numbers:
    """Gauge points: each one sample's value."""

    def __init__(self, points: list[tuple]) -> None:
        self.points = points  # (point, value index)

    def fill(self, values: list, now_ns: int, starts: Starts) -> None:
        for p, i in self.points:
            p.time_unix_nano = now_ns
            p.as_double = values[i]


class _Counters:
    """Monotonic sum points: each one sample's value since its start time."""

    def __init__(self, points: list[tuple]) -> None:
        self.points = points  # (point, series key, value index, `_created` value index or None)

    def fill(self, values: list, now_ns: int, starts: Starts) -> None:
        for p, key, i, created in self.points:
            value = values[i]
            start = starts.start(key, None if created is None else values[created], value, now_ns)
            p.time_unix_nano = now_ns
            p.start_time_unix_nano = start
            p.as_double = value


class _Histogram:
    """One histogram series' point: its buckets (cumulative on the wire, per bucket in OTLP), count and sum."""

    def __init__(self, point, key: tuple, where: str, buckets: list[tuple[float, int]], count: int | None,
                 total: int | None, created: int | None) -> None:
        self.point, self.key, self.where = point, key, where
        self.count, self.total, self.created = count, total, created  # value indices (or None)
        les = [le for le, _ in buckets]
        self.buckets = buckets  # (le, value index), in exposition order
        self.in_order = None  # values -> the bucket values by le, when that order does not depend on values
        if len(set(les)) == len(les) and not any(math.isnan(le) for le in les):
            self.les = sorted(les)
            self.in_order = _getter([i for _, i in sorted(buckets)])
            point.explicit_bounds.extend(self.les[:-1])

    def fill(self, values: list, now_ns: int, starts: Starts) -> None:
        if self.in_order is not None:
            les, cumulative = self.les, self.in_order(values)
        else:  # equal or NaN bounds: sorted with the values, as (le, value) pairs
            pairs = sorted([(le, values[i]) for le, i in self.buckets])
            les, cumulative = [le for le, _ in pairs], tuple(c for _, c in pairs)
        if not cumulative or les[-1] != math.inf:
            raise ScrapeError("malformed", f"{self.where} has no +Inf bucket")
        if any(map(operator.gt, cumulative, cumulative[1:])):
            raise ScrapeError("malformed", f"{self.where}: buckets not cumulative")
        count = cumulative[-1] if self.count is None else values[self.count]
        start = starts.start(self.key, None if self.created is None else values[self.created], count, now_ns)
        count = int(count)
        p = self.point
        p.start_time_unix_nano = start
        p.time_unix_nano = now_ns
        p.count = count
        p.sum = 0.0 if self.total is None else values[self.total]
        if self.in_order is None:
            del p.explicit_bounds[:]
            p.explicit_bounds.extend(les[:-1])
        del p.bucket_counts[:]
        p.bucket_counts.extend(list(map(int, map(operator.sub, cumulative, (0.0,) + cumulative[:-1]))))


class _Raise:
    """An error the families cause (a bucket without a numeric `le`, say), raised when its turn comes."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def fill(self, values: list, now_ns: int, starts: Starts) -> None:
        raise self.error.with_traceback(None)  # (each raise would otherwise lengthen its traceback)


def _getter(indices: list[int]):
    """values -> the tuple of those values (itemgetter, which gives a bare item for one index)."""
    if len(indices) > 1:
        return itemgetter(*indices)
    return lambda values: tuple(values[i] for i in indices)


def _key(labels: dict) -> tuple:
    return tuple(sorted(labels.items()))


def _gauge(sm, name: str, description: str = "") -> metrics_pb2.Metric:
    metric = sm.metrics.add(name=name, description=description)
    metric.gauge.SetInParent()
    return metric


def _point(points, attrs: list[KeyValue]):
    p = points.add()
    p.attributes.extend(attrs)
    return p


def _kvs(items: Iterator[tuple[str, str]]) -> list[KeyValue]:
    return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in items]


def _label_attributes(labels: dict) -> list[KeyValue]:
    return _kvs(labels.items())


def _canonical_attributes(rev: Reverse):
    if rev.instrument == CACHE_CONFIG_INFO:  # every label but the engine is a cache-config entry
        engine = next(k for k, v in rev.labels.items() if v == ENGINE_ATTRIBUTE)
        return lambda labels: _kvs((ENGINE_ATTRIBUTE if k == engine else CACHE_CONFIG_PREFIX + k, v)
                                   for k, v in labels.items())
    return lambda labels: _kvs((rev.labels.get(k, k), v) for k, v in labels.items())
