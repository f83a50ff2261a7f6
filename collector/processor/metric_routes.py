"""The shim inside the collector: where each OTLP metric goes on the Prometheus side.

A `Router` is built from one profile of `otel_llm.shim.profiles` (any of
`PROFILE_NAMES`; imported, never copied), so the collector exposes exactly what a
server's own `/metrics?compat=NAME` does:

- a canonical otel_llm instrument (same name and kind as in
  `otel_llm.canonical.instruments`) becomes each family the profile makes of it (one
  route per family: SGLang and Triton expose some instruments several times):
  its name, the base labels (model and engine, or the family's own, plus its
  fixed `const` labels), the per-request dimensions the profile keeps (through
  its value maps), the profile's buckets; attributes the profile does not expose
  are summed away. A series whose dimension values a family's `only` leaves out
  is kept but never shown; a `part` family shows a histogram's sum or count as a
  counter, `scale` converts units at exposition, a `cache_key` gauge is valued
  from the cache-config point's entries. A canonical instrument the profile
  leaves out is dropped, as on the server. Speculative-decoding families come
  out under the profile's names when their points arrive (a server exports them
  only where speculative decoding is in use), for whatever draft positions
  arrive. `otel_llm.lora.requests` keeps its adapter attribute as a label, as
  the server's renderer does; the store's cardinality limit bounds it.
- a pipeline's instrument (`otel_llm.pipeline.families`: vLLM-Omni's families as OTel
  instruments) becomes its vLLM-Omni family (`vllm_omni:` and its labels) or, under the `otel`
  profile, the OTel Prometheus translation of its name and attributes, as the server's own
  `/metrics` writes it either way;
- a metric the scrape receiver read under its own Prometheus name (scope
  `otel_llm.collector.scrape`) keeps that name and its labels, verbatim;
- any other metric keeps its own name, translated by the OTel specification's
  Prometheus rules (`otel_llm.shim.prometheus_naming`), its attributes as labels, plus
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
import json
from dataclasses import dataclass, field
from typing import NamedTuple

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from otel_llm.canonical.cardinality import OVERFLOW_ATTRIBUTE
from otel_llm.canonical.instruments import (
    ADAPTER_ATTRIBUTE, CACHE_CONFIG_INFO, CACHE_CONFIG_PREFIX, DEFAULT_MODEL_VERSION, ENGINE_ATTRIBUTE, LORA_REQUESTS,
    DECLARED_AT_ZERO, MAX_SPEC_POSITIONS, MODEL_ATTRIBUTE, SPEC_DECODE, Instrument, Kind, instrument_table,
)
from otel_llm.collector.pdata import metrics_wire as wire
from otel_llm.export.exposition import cache_value, series_groups
from otel_llm.pipeline.families import BY_OTEL, PipelineFamily
from otel_llm.shim.profile import Profile, ProfileFamily
from otel_llm.shim.profiles import get_profile
from otel_llm.shim.prometheus_naming import label_name, metric_name

OVERFLOW = ("otel_metric_overflow", "true")
SCRAPE_SCOPE = "otel_llm.collector.scrape"  # metrics a scrape target exposed under their own names
Pairs = tuple[tuple[str, str], ...]  # label (name, raw value) pairs of one series
_KINDS = {"gauge": Kind.GAUGE, "histogram": Kind.HISTOGRAM}
_VERSION = DEFAULT_MODEL_VERSION  # OTLP carries no model version: the servers' default ("1")
_ADAPTER_LABEL = label_name(ADAPTER_ATTRIBUTE)  # as the server's renderer names it


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


def collector_profile(name: str) -> Profile:
    """The profile's table as a collector applies it: with the speculative-decoding families for every
    draft position a server may have, the KV residency histograms, goodput and the MFU estimates (a server
    sends them only where it uses speculative decoding, `--kv-cache-metrics`, SLO objectives or
    `--enable-mfu-metrics`)."""
    return get_profile(name, num_speculative_tokens=MAX_SPEC_POSITIONS, kv_cache_metrics=True, goodput=True,
                       mfu_metrics=True)


class Placement(NamedTuple):
    """Where one input series goes: its exposed labels, and the empty series to pre-create with it."""

    pairs: Pairs  # its labels (`shown` False: the base and sender labels of a series never shown)
    siblings: tuple[Pairs, ...] = ()  # empty series to pre-create (the profile's, emit_empty)
    factor: float = 1.0  # exposed value per point value (a `cache_key` gauge: the cache entries' product)
    shown: bool = True  # False: the profile leaves it out (`only`, a cache entry that is not a number)


@dataclass(frozen=True)
class Route:
    """Where one OTLP metric's points go: family, kind, and how attributes become labels."""

    family: str
    kind: Kind
    help: str  # "": no HELP line
    buckets: tuple[float, ...] | None  # bounds to re-bucket to, in the input's unit; None = the input's
    profile: Profile | None = None
    profile_family: ProfileFamily | None = None
    instrument: Instrument | None = None
    scope_pairs: tuple[tuple[str, str], ...] = field(default=())
    empty: tuple[Pairs, ...] = ()  # the profile's pre-created series of the family: labels after the base
    rename: tuple[tuple[str, str], ...] = ()  # a pipeline family's (attribute, label) pairs, its labels in order

    @property
    def counter_suffix(self) -> str:
        return "_total" if self.profile is None else self.profile.counter_suffix

    @property
    def scale(self) -> float:
        return 1.0 if self.profile_family is None else self.profile_family.scale

    @property
    def part(self) -> str | None:
        return None if self.profile_family is None else self.profile_family.part

    @property
    def shown_buckets(self) -> tuple[float, ...] | None:
        """`buckets` as the family writes its `le` (its unit)."""
        return None if self.profile_family is None else self.profile_family.buckets

    def labels(self, key_values, resource: ResourceInfo) -> Placement:
        attrs = {kv.key: attribute_text(kv.value) for kv in key_values}
        if self.rename:
            if attrs.get(OVERFLOW_ATTRIBUTE) == "true":
                return Placement(self.overflow_labels(resource))
            own = tuple((label, attrs.get(attr, "")) for attr, label in self.rename)
            return Placement(_exported(own, resource.pairs) + resource.pairs)
        if self.profile is None:
            pairs = _exported(_merged(attrs.items()), self.scope_pairs + resource.pairs)
            return Placement(pairs + self.scope_pairs + resource.pairs)
        if attrs.get(OVERFLOW_ATTRIBUTE) == "true":
            # Beyond the sender's own limit, as its renderer shows it; the point sums every dimension
            # value, so a family's `only` cannot apply to it.
            return Placement(self.overflow_labels(resource))
        profile, fam, inst = self.profile, self.profile_family, self.instrument
        if inst.name == CACHE_CONFIG_INFO and not fam.cache_key:
            engine = ((profile.engine_label, attrs.get(ENGINE_ATTRIBUTE, "")),)
            base = _exported(tuple((k[len(CACHE_CONFIG_PREFIX):], v) for k, v in sorted(attrs.items())
                                   if k.startswith(CACHE_CONFIG_PREFIX)), engine + resource.pairs)
            return Placement(base + engine + resource.pairs)
        source = {"model": attrs.get(MODEL_ATTRIBUTE, ""), "engine": attrs.get(ENGINE_ATTRIBUTE, ""),
                  "version": _VERSION}
        base = tuple((label, source[f]) for label, f in (profile.base_labels if fam.base is None else fam.base))
        base += fam.const
        siblings = tuple(base + pairs + resource.pairs for pairs in self.empty)
        factor = cache_value({k[len(CACHE_CONFIG_PREFIX):]: v for k, v in attrs.items()
                              if k.startswith(CACHE_CONFIG_PREFIX)}, fam.cache_key) if fam.cache_key else 1.0
        if factor is None or any(attrs.get(d) not in values for d, values in fam.only.items()):
            return Placement(base + resource.pairs, siblings, shown=False)
        own = []
        for d in inst.dims:
            if d in fam.labels and d in attrs:
                label, vmap = fam.labels[d]
                value = vmap(attrs[d])
                if value is not None:
                    own.append((label, value))
        if inst.name == LORA_REQUESTS:
            own.append((_ADAPTER_LABEL, attrs.get(ADAPTER_ATTRIBUTE, "")))
        pairs = base + tuple(own) + resource.pairs
        return Placement(pairs, tuple(s for s in siblings if s != pairs), factor)

    def overflow_labels(self, resource: ResourceInfo) -> Pairs:
        const = () if self.profile_family is None else self.profile_family.const
        return (OVERFLOW,) + const + self.scope_pairs + resource.pairs


class Router:
    """Routes for one profile (any of `otel_llm.shim.profiles.PROFILE_NAMES`; ValueError naming another)."""

    def __init__(self, profile_name: str):
        self.profile = collector_profile(profile_name)
        self._instruments = instrument_table(8192)  # names and kinds do not depend on max_model_len
        self._families: dict[str, list[ProfileFamily]] = {}
        for fam in self.profile.families:
            self._families.setdefault(fam.canonical, []).append(fam)

    resource = staticmethod(resource_info)

    def route(self, scope: bytes, metric, kind: str, monotonic: bool) -> tuple[Route, ...]:
        """The routes of a metric (view of `otlp_metrics_wire.Metric`), one per family it feeds; none:
        dropped by the profile."""
        prom_kind = Kind.COUNTER if monotonic else _KINDS.get(kind, Kind.GAUGE)
        inst = self._instruments.get(metric.name)
        if inst is not None and inst.kind is prom_kind:
            return tuple(self._profile_route(inst, fam) for fam in self._families.get(inst.name, ()))
        pipeline = BY_OTEL.get(metric.name)
        if pipeline is not None and pipeline.kind is prom_kind:
            return (self._pipeline_route(pipeline),)
        s = wire.decode_scope(scope)
        if s.name == SCRAPE_SCOPE:  # scraped under its own Prometheus name: kept verbatim
            return (Route(metric.name, prom_kind, metric.description, None),)
        scope_pairs = tuple((k, v) for k, v in (("otel_scope_name", s.name), ("otel_scope_version", s.version)) if v)
        return (Route(metric_name(metric.name, metric.unit, prom_kind), prom_kind, metric.description, None,
                      scope_pairs=scope_pairs),)

    def _pipeline_route(self, fam: PipelineFamily) -> Route:
        name, labels = fam.exposed(otel=self.profile.name == "otel")
        return Route(name, fam.kind, fam.help, None, rename=tuple(zip(fam.attributes, labels)))

    def _profile_route(self, inst: Instrument, fam: ProfileFamily) -> Route:
        # The series a server pre-creates (emit_empty), except where it depends on what the collector
        # cannot know: its draft positions, its adapters, its cache config.
        precreated = ((self.profile.emit_empty or inst.name in DECLARED_AT_ZERO)
                      and not inst.name.startswith(SPEC_DECODE) and inst.name not in (LORA_REQUESTS, CACHE_CONFIG_INFO))
        return Route(fam.name, fam.kind(inst), inst.description if fam.help is None else fam.help,
                     None if fam.part else fam.canonical_buckets, self.profile, fam, inst,
                     empty=tuple(pairs for pairs, _ in series_groups(inst, fam)) if precreated else ())
