"""A Prometheus or OpenMetrics exposition -> one OTLP ExportMetricsServiceRequest (the shim in reverse).

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
"""

from __future__ import annotations

import math
from collections.abc import Iterator
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


def parse(text: str, openmetrics: bool):
    """prometheus_client's families, lazily (its parser raises ValueError on malformed text)."""
    if openmetrics:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    return text_string_to_metric_families(text)


class Converter:
    """One target's conversions; `starts` persists between its scrapes (series -> start ns, last value)."""

    def __init__(self, job: str, instance: str, extra_resource: dict[str, str] | None = None,
                 sample_limit: int = 50_000) -> None:
        attrs = {"service.name": job, "service.instance.id": instance, **(extra_resource or {})}
        self.resource = Resource(attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attrs.items()])
        self.resource_key = self.resource.SerializeToString()
        self.sample_limit = sample_limit
        self.starts: dict[tuple, tuple[int, float]] = {}
        self.first_ns = 0

    def convert(self, text: str, openmetrics: bool, now_ns: int, extra: dict[str, float]) -> bytes:
        """ExportMetricsServiceRequest bytes. `extra`: gauges to add (up, scrape_duration_seconds), and
        scrape_samples_scraped is added. Raises ScrapeError (malformed text, too many samples)."""
        if not self.first_ns:
            self.first_ns = now_ns
        request, sm = self._request()
        starts: dict[tuple, tuple[int, float]] = {}
        samples = 0
        try:
            families = []
            for fam in parse(text, openmetrics):
                samples += len(fam.samples)
                if samples > self.sample_limit:
                    raise ScrapeError("sample_limit", f"more than {self.sample_limit} samples (sample_limit)")
                families.append(fam)
            types = {fam.name: fam.type for fam in families}
            created = {}  # text 0.0.4 writes a counter's or histogram's `_created` as a gauge family of its own
            for fam in families:
                if fam.name.endswith("_created") and types.get(fam.name[:-8]) in ("counter", "histogram"):
                    created[fam.name[:-8]] = {_key(s.labels): s.value for s in fam.samples}
            for fam in families:
                if not (fam.name.endswith("_created") and fam.name[:-8] in created):  # those are start times
                    self._family(sm, fam, now_ns, starts, created.get(fam.name, {}))
        except ScrapeError:
            raise
        except (ValueError, TypeError, KeyError, IndexError) as exc:  # prometheus_client's parse errors
            raise ScrapeError("malformed", f"malformed exposition: {exc}") from None
        _gauges(sm, {**extra, "scrape_samples_scraped": float(samples)}, now_ns)
        self.starts = starts  # only the series still there
        return request.SerializeToString()

    def up_only(self, now_ns: int, extra: dict[str, float]) -> bytes:
        """A failed scrape: only `up` and the scrape_* gauges."""
        request, sm = self._request()
        _gauges(sm, extra, now_ns)
        return request.SerializeToString()

    def _request(self):
        """An empty request for this target: (request, its one ScopeMetrics)."""
        request = ExportMetricsServiceRequest()
        sm = request.resource_metrics.add(resource=self.resource).scope_metrics.add(
            scope=InstrumentationScope(name=SCOPE))
        return request, sm

    # -- one family ------------------------------------------------------------------------

    def _family(self, sm, fam, now_ns: int, starts: dict, created: dict) -> None:
        kind = _TYPE_KIND.get(fam.type)
        rev = _REVERSE.get(fam.name)
        if rev is not None and rev.kind is kind:
            name, to_attrs = rev.instrument, _canonical_attributes(rev)
        else:
            name, to_attrs = fam.name, _label_attributes
            if kind is Kind.COUNTER and not all(s.name in (fam.name + "_total", fam.name + "_created")
                                                for s in fam.samples):
                kind = None  # a counter without `_total` keeps its sample name, as a gauge
        created = {**created, **{_key(s.labels): s.value for s in fam.samples if s.name == fam.name + "_created"}}
        if kind is Kind.HISTOGRAM:
            self._histograms(sm, name, fam, to_attrs, now_ns, starts, created)
        elif kind is Kind.COUNTER:
            self._counters(sm, name, fam, to_attrs, now_ns, starts, created)
        elif kind is Kind.GAUGE and name != fam.name:  # a canonical gauge
            metric = _gauge(sm, name, fam.documentation)
            for s in fam.samples:
                _number(metric.gauge.data_points, to_attrs(s.labels), now_ns, s.value)
        else:  # everything else by sample name: gauges, summaries, info, untyped
            by_name: dict[str, metrics_pb2.Metric] = {}
            for s in fam.samples:
                if s.name == fam.name + "_created":  # a start time (OpenMetrics)
                    continue
                metric = by_name.get(s.name)
                if metric is None:
                    metric = by_name[s.name] = _gauge(sm, s.name, fam.documentation)
                _number(metric.gauge.data_points, to_attrs(s.labels), now_ns, s.value)

    def _start(self, key: tuple, created: float | None, value: float, now_ns: int, starts: dict) -> int:
        if created is not None:
            start = round(created * 1e9)
        else:
            start, last = self.starts.get(key, (self.first_ns, value))
            if value < last:  # went down: the target restarted
                start = now_ns
        starts[key] = (start, value)
        return start

    def _counters(self, sm, name, fam, to_attrs, now_ns, starts, created) -> None:
        metric = sm.metrics.add(name=name, description=fam.documentation)
        metric.sum.aggregation_temporality = _CUMULATIVE
        metric.sum.is_monotonic = True
        for s in fam.samples:
            if s.name == fam.name + "_created":
                continue
            key = (fam.name, _key(s.labels))
            start = self._start(key, created.get(key[1]), s.value, now_ns, starts)
            _number(metric.sum.data_points, to_attrs(s.labels), now_ns, s.value, start)

    def _histograms(self, sm, name, fam, to_attrs, now_ns, starts, created) -> None:
        series: dict[tuple, dict] = {}
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            h = series.setdefault(_key(labels), {"labels": labels, "buckets": []})
            suffix = s.name[len(fam.name):]
            if suffix == "_bucket":
                h["buckets"].append((float(s.labels["le"]), s.value))
            elif suffix in ("_count", "_sum"):
                h[suffix] = s.value
        metric = sm.metrics.add(name=name, description=fam.documentation)
        metric.histogram.aggregation_temporality = _CUMULATIVE
        for key, h in series.items():
            buckets = sorted(h["buckets"])
            if not buckets or buckets[-1][0] != math.inf:
                raise ScrapeError("malformed", f"histogram {fam.name}{dict(h['labels'])} has no +Inf bucket")
            cumulative = [c for _, c in buckets]
            if any(b < a for a, b in zip(cumulative, cumulative[1:])):
                raise ScrapeError("malformed", f"histogram {fam.name}{dict(h['labels'])}: buckets not cumulative")
            count = h.get("_count", cumulative[-1])
            start = self._start((fam.name, key), created.get(key), count, now_ns, starts)
            p = metric.histogram.data_points.add(start_time_unix_nano=start, time_unix_nano=now_ns,
                                                 count=int(count), sum=h.get("_sum", 0.0))
            p.attributes.extend(to_attrs(h["labels"]))
            p.explicit_bounds.extend(le for le, _ in buckets[:-1])
            p.bucket_counts.extend(int(b - a) for a, b in zip([0.0] + cumulative[:-1], cumulative))


def _key(labels: dict) -> tuple:
    return tuple(sorted(labels.items()))


def _gauge(sm, name: str, description: str = "") -> metrics_pb2.Metric:
    metric = sm.metrics.add(name=name, description=description)
    metric.gauge.SetInParent()
    return metric


def _gauges(sm, values: dict[str, float], now_ns: int) -> None:
    for name, value in values.items():
        _gauge(sm, name).gauge.data_points.add(time_unix_nano=now_ns, as_double=value)


def _number(points, attrs: list[KeyValue], now_ns: int, value: float, start_ns: int = 0) -> None:
    p = points.add(time_unix_nano=now_ns, start_time_unix_nano=start_ns, as_double=value)
    p.attributes.extend(attrs)


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
