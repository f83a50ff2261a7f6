"""The shim inside the collector: where each OTLP metric goes on the Prometheus side.

A `Router` is built from one profile of `otel_llm.profiles` (imported, never
copied), so the collector exposes exactly what a server's own `/metrics` does:

- a canonical otel_llm instrument (same name and kind as in
  `otel_llm.instruments`) becomes the profile's family: its name, the model and
  engine attributes under the profile's labels, the per-request dimensions the
  profile keeps (through its value maps), the profile's buckets; attributes the
  profile does not expose are summed away. A canonical instrument the profile
  leaves out is dropped, as on the server.
- a metric the scrape receiver read under its own Prometheus name (scope
  `otel_llm.collector.scrape`) keeps that name and its labels, verbatim;
- any other metric keeps its own name, translated by the OTel specification's
  Prometheus rules (`otel_llm.prometheus_naming`), its attributes as labels, plus
  ``otel_scope_name``/``otel_scope_version``.

Every series also gets ``job`` (``service.namespace/service.name``) and
``instance`` (``service.instance.id``) from its resource; the other resource
attributes go on that resource's ``target_info`` series. Series of different
servers therefore never collide.

Routes are immutable and computed once per (scope, metric name, kind); label
text is computed once per new input series.
"""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import dataclass, field

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from collector import otlp_metrics_wire as wire
from otel_llm.instruments import (
    CACHE_CONFIG_INFO, CACHE_CONFIG_PREFIX, DIMENSIONS, ENGINE_ATTRIBUTE, MODEL_ATTRIBUTE, Instrument, Kind,
    instrument_table,
)
from otel_llm.profiles import Family as ProfileFamily
from otel_llm.profiles import Profile, get_profile
from otel_llm.prometheus_naming import label_name, metric_name

OVERFLOW = ("otel_metric_overflow", "true")
SCRAPE_SCOPE = "otel_llm.collector.scrape"  # metrics a scrape target exposed under their own names
Pairs = tuple[tuple[str, str], ...]  # label (name, raw value) pairs of one series
_KINDS = {"gauge": Kind.GAUGE, "histogram": Kind.HISTOGRAM}


def attribute_text(value: AnyValue) -> str:
    """An AnyValue as a Prometheus label value (OTel's non-string attribute rules)."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which == "int_value":
        return str(value.int_value)
    if which == "double_value":
        return repr(value.double_value)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if which == "array_value":
        return json.dumps([attribute_text(v) for v in value.array_value.values])
    if which == "kvlist_value":
        return json.dumps({kv.key: attribute_text(kv.value) for kv in value.kvlist_value.values})
    return ""


@dataclass
class ResourceInfo:
    """One sender's resource: its job/instance labels and `target_info` labels."""

    job: str
    instance: str
    target_pairs: Pairs  # labels of its target_info series (job and instance included)
    pairs: Pairs  # (job, instance) to append to its series (empty values left out)
    seen_s: float = 0.0
    num_series: int = 0


def resource_info(raw: bytes) -> ResourceInfo:
    attrs = {kv.key: attribute_text(kv.value) for kv in wire.decode_resource(raw).attributes}
    name, namespace = attrs.get("service.name", ""), attrs.get("service.namespace", "")
    job = f"{namespace}/{name}" if namespace and name else name
    instance = attrs.get("service.instance.id", "")
    pairs = tuple((k, v) for k, v in (("job", job), ("instance", instance)) if v)
    other = _merged((k, v) for k, v in attrs.items()
                    if k not in ("service.name", "service.namespace", "service.instance.id"))
    return ResourceInfo(job, instance, other + pairs, pairs)


def _exported(pairs: Pairs, ours: Pairs) -> Pairs:
    """`pairs` with a label that one of `ours` also names renamed `exported_<label>`, as Prometheus does."""
    reserved = {label for label, _ in ours}
    return tuple(("exported_" + k if k in reserved else k, v) for k, v in pairs)


def _merged(items) -> tuple[tuple[str, str], ...]:
    """Attributes -> label pairs sorted by label; keys that sanitize alike join values with ';'
    in the order of their original keys (the specification's collision rule)."""
    by_label: dict[str, list[tuple[str, str]]] = {}
    for key, value in sorted(items):
        by_label.setdefault(label_name(key), []).append((key, value))
    return tuple((label, ";".join(v for _, v in kvs)) for label, kvs in sorted(by_label.items()))


@dataclass(frozen=True)
class Route:
    """Where one OTLP metric's points go: family, kind, and how attributes become labels."""

    family: str
    kind: Kind
    help: str
    buckets: tuple[float, ...] | None  # exposed bucket bounds (a subset of the input's); None = the input's
    profile: Profile | None = None
    profile_family: ProfileFamily | None = None
    instrument: Instrument | None = None
    scope_pairs: tuple[tuple[str, str], ...] = field(default=())

    def labels(self, key_values, resource: ResourceInfo) -> tuple[Pairs, tuple[Pairs, ...]]:
        """(labels of the series, labels of empty siblings to pre-create)."""
        attrs = {kv.key: attribute_text(kv.value) for kv in key_values}
        if self.profile is None:
            pairs = _exported(_merged(attrs.items()), self.scope_pairs + resource.pairs)
            return pairs + self.scope_pairs + resource.pairs, ()
        profile, fam, inst = self.profile, self.profile_family, self.instrument
        if inst.name == CACHE_CONFIG_INFO:
            engine = ((profile.engine_label, attrs.get(ENGINE_ATTRIBUTE, "")),)
            base = _exported(tuple((k[len(CACHE_CONFIG_PREFIX):], v) for k, v in sorted(attrs.items())
                                   if k.startswith(CACHE_CONFIG_PREFIX)), engine + resource.pairs)
            return base + engine + resource.pairs, ()
        model, engine = attrs.get(MODEL_ATTRIBUTE, ""), attrs.get(ENGINE_ATTRIBUTE, "")
        base = ((profile.model_label, model), (profile.engine_label, engine))
        if fam.base is not None:  # the family's own (vLLM's frontend counters: no engine; engines summed)
            base = tuple((label, {"model": model, "engine": engine}[f]) for label, f in fam.base)
        kept = [(d,) + fam.labels[d] for d in inst.dims if d in fam.labels]
        own = [(label, vmap(attrs[d])) for d, label, vmap in kept if d in attrs]
        pairs = base + tuple((k, v) for k, v in own if v is not None) + resource.pairs
        if not (profile.emit_empty and kept):
            return pairs, ()
        siblings = []
        for values in itertools.product(*(DIMENSIONS[d] for d, _, _ in kept)):
            mapped = tuple((label, vmap(v)) for (_, label, vmap), v in zip(kept, values))
            siblings.append(base + tuple((k, v) for k, v in mapped if v is not None) + resource.pairs)
        return pairs, tuple(dict.fromkeys(s for s in siblings if s != pairs))

    def overflow_labels(self, resource: ResourceInfo) -> Pairs:
        return (OVERFLOW,) + self.scope_pairs + resource.pairs


class Router:
    """Routes for one profile (`vllm` or `otel`)."""

    def __init__(self, profile_name: str):
        self.profile = get_profile(profile_name)
        self._instruments = instrument_table(8192)  # names and kinds do not depend on max_model_len
        self._families = {f.canonical: f for f in self.profile.families}

    resource = staticmethod(resource_info)

    def route(self, scope: bytes, metric, kind: str, monotonic: bool) -> Route | None:
        """The route of a metric (view of `otlp_metrics_wire.Metric`); None: dropped by the profile."""
        prom_kind = Kind.COUNTER if monotonic else _KINDS.get(kind, Kind.GAUGE)
        inst = self._instruments.get(metric.name)
        if inst is not None and inst.kind is prom_kind:
            fam = self._families.get(inst.name)
            if fam is None:
                return None
            return Route(fam.name, inst.kind, inst.description, fam.buckets if fam.buckets is not None else None,
                         self.profile, fam, inst)
        s = wire.decode_scope(scope)
        if s.name == SCRAPE_SCOPE:  # scraped under its own Prometheus name: kept verbatim
            return Route(metric.name, prom_kind, metric.description, None)
        scope_pairs = tuple((k, v) for k, v in (("otel_scope_name", s.name), ("otel_scope_version", s.version)) if v)
        return Route(metric_name(metric.name, metric.unit, prom_kind), prom_kind, metric.description, None,
                     scope_pairs=scope_pairs)
