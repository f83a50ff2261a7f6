"""The compatibility shim: per profile, a table from canonical instruments to exposed families.

A profile maps each canonical instrument (`instruments.py`) to a target family:
its Prometheus name, which per-request dimensions become labels (and under what
name), and optionally coarser histogram buckets (a subset of the canonical
ones, so re-bucketing is exact). Base labels (model, engine) are named per
profile. The same tables generate the collector's rename rules, so the
in-process exposition and the collector cannot disagree.

- `vllm`: exactly vLLM's `PrometheusStatLogger` names, types, labels
  (`model_name`, `engine`, `finished_reason`) and buckets.
- `otel`: semconv names as the OTel Prometheus translation writes them
  (dots -> `_`, unit suffix, `_total` on counters), attributes as labels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from . import custom_buckets
from . import instruments as I
from .prometheus_naming import metric_name

LabelMap = dict[str, tuple[str, Callable[[str], str | None]]]  # dim -> (label, value map; None drops)


def _same(v: str) -> str:
    return v


@dataclass(frozen=True)
class Family:
    """How one canonical instrument is exposed in a profile."""

    canonical: str
    name: str  # family name; counters get `_total` on their sample
    labels: LabelMap = field(default_factory=dict)
    buckets: tuple[float, ...] | None = None  # in the family's unit; None: the canonical buckets
    scale: float = 1.0  # exposed value = canonical value x scale (Triton: seconds -> us or ms)
    part: str | None = None  # "sum" | "count": a histogram's sum or count, exposed as a counter
    const: tuple[tuple[str, str], ...] = ()  # fixed labels, after the base ones
    only: dict[str, tuple[str, ...]] = field(default_factory=dict)  # dim -> the values whose series count
    help: str | None = None  # None: the canonical description; "": no HELP line (names a server never describes)
    # A gauge valued from the cache config: the product of these entries (Triton's block size:
    # ("block_size",)); canonical is CACHE_CONFIG_INFO; the series is left out while an entry is not a number.
    cache_key: tuple[str, ...] = ()
    # (label, Source field) pairs replacing the profile's base labels (vLLM's frontend counters have no engine)
    base: tuple[tuple[str, str], ...] | None = None

    @property
    def canonical_buckets(self) -> tuple[float, ...] | None:
        """The family's bounds in the canonical unit (what aggregation must include)."""
        if self.buckets is None:
            return None
        return self.buckets if self.scale == 1.0 else tuple(b / self.scale for b in self.buckets)

    def kind(self, inst: I.Instrument) -> I.Kind:
        return I.Kind.COUNTER if self.part else inst.kind


@dataclass(frozen=True)
class Profile:
    name: str
    model_label: str
    engine_label: str
    families: tuple[Family, ...]
    emit_empty: bool  # vLLM pre-creates every labelled child; OTel exports only series with data
    base: tuple[tuple[str, str], ...] | None = None  # (label, Source field); None: model and engine
    counter_suffix: str = "_total"  # "" where the server's client library adds none (Rust, C++)
    openmetrics: bool = True  # False: always text 0.0.4, as the server (its counters keep their names)
    # vLLM-Omni: the engine label reshaped into `stage` + `replica` (Source.stage, Source.replica)
    stage_replica: bool = False

    @property
    def base_labels(self) -> tuple[tuple[str, str], ...]:
        if self.base is not None:
            return self.base
        if self.stage_replica:
            return ((self.model_label, "model"), ("stage", "stage"), ("replica", "replica"))
        return ((self.model_label, "model"), (self.engine_label, "engine"))


# Families vLLM renamed or removed, by the `--show-hidden-metrics-for-version` value that showed them
# again (vLLM: "deprecated in X.Y, hidden in X.Y+1, re-enabled with =X.Y, removed in X.Y+2"; the gpu_
# names, deprecated in 0.9.2, were hidden in 0.11 behind =0.10). Values from the canonical data.
HIDDEN_VLLM = {
    "0.8": (Family("otel_llm.request.queue.duration", "vllm:time_in_queue_requests",
                   help="Histogram of time the request spent in the queue in seconds."),),
    "0.10": (Family("otel_llm.kv_cache.usage", "vllm:gpu_cache_usage_perc",
                    help="GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc "
                         "instead."),
             Family("otel_llm.prefix_cache.queries", "vllm:gpu_prefix_cache_queries",
                    help="GPU prefix cache queries, in terms of number of queriedtokens. DEPRECATED: Use "
                         "vllm:prefix_cache_queries instead."),
             Family("otel_llm.prefix_cache.hits", "vllm:gpu_prefix_cache_hits",
                    help="GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: Use "
                         "vllm:prefix_cache_hits instead.")),
    "0.11": (Family("otel_llm.request.inter_token_latency", "vllm:time_per_output_token_seconds",
                    help="Histogram of time per output token in seconds.DEPRECATED: Use "
                         "vllm:inter_token_latency_seconds instead."),),
}


def hidden_version(value: str | None) -> str | None:
    """`--show-hidden-metrics-for-version` as the `HIDDEN_VLLM` key it selects ("0.10.2" -> "0.10");
    ValueError for a value that is not a version."""
    if value is None:
        return None
    parts = value.strip().split(".")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ValueError(f"--show-hidden-metrics-for-version {value!r}: expected a version X.Y "
                         f"(vLLM hid metrics for {', '.join(HIDDEN_VLLM)})")
    return f"{int(parts[0])}.{int(parts[1])}"


def _with_custom(fams: list[Family], custom: dict[str, tuple[float, ...]]) -> tuple[Family, ...]:
    """The families with the operator's buckets (`custom_buckets.resolve`) where given."""
    return tuple(replace(f, buckets=custom[f.canonical]) if f.canonical in custom and not f.part else f
                 for f in fams)


def _vllm_spec_decode(k: int) -> tuple[Family, ...]:
    """vLLM's `SpecDecodingProm`: declared only when speculative decoding is configured, with one
    per-position series for each of its k draft positions (`num_speculative_tokens`)."""
    if k <= 0:
        return ()
    position = "otel_llm.spec_decode.position"
    return (Family("otel_llm.spec_decode.drafts", "vllm:spec_decode_num_drafts"),
            Family("otel_llm.spec_decode.draft_tokens", "vllm:spec_decode_num_draft_tokens"),
            Family("otel_llm.spec_decode.accepted_tokens", "vllm:spec_decode_num_accepted_tokens"),
            Family("otel_llm.spec_decode.accepted_tokens_per_pos", "vllm:spec_decode_num_accepted_tokens_per_pos",
                   {position: ("position", _same)}, only={position: I.DIMENSIONS[position][:k]}))


def _vllm_kv_residency(on: bool) -> tuple[Family, ...]:
    """vLLM's `--kv-cache-metrics` histograms: declared only when it is on."""
    return (Family("otel_llm.kv_block.lifetime", "vllm:kv_block_lifetime_seconds"),
            Family("otel_llm.kv_block.idle_before_evict", "vllm:kv_block_idle_before_evict_seconds"),
            Family("otel_llm.kv_block.reuse_gap", "vllm:kv_block_reuse_gap_seconds")) if on else ()


def _vllm(custom: dict[str, tuple[float, ...]], hidden: str | None, num_speculative_tokens: int = 0,
          kv_cache_metrics: bool = False) -> Profile:
    reason = {"otel_llm.finish_reason": ("finished_reason", _same)}
    fams = [
        Family("otel_llm.scheduler.running", "vllm:num_requests_running"),
        Family("otel_llm.scheduler.waiting", "vllm:num_requests_waiting"),
        Family("otel_llm.kv_cache.usage", "vllm:kv_cache_usage_perc"),
        Family("otel_llm.prefix_cache.queries", "vllm:prefix_cache_queries"),
        Family("otel_llm.prefix_cache.hits", "vllm:prefix_cache_hits"),
        Family("otel_llm.scheduler.preemptions", "vllm:num_preemptions"),
        Family("otel_llm.usage.prompt_tokens", "vllm:prompt_tokens"),
        Family("otel_llm.usage.generation_tokens", "vllm:generation_tokens"),
        Family("otel_llm.request.finished", "vllm:request_success", reason),
        Family("otel_llm.request.prompt_tokens", "vllm:request_prompt_tokens"),
        Family("otel_llm.request.generation_tokens", "vllm:request_generation_tokens"),
        Family("otel_llm.step.tokens", "vllm:iteration_tokens_total"),
        Family("otel_llm.request.max_generation_tokens", "vllm:request_max_num_generation_tokens"),
        Family("otel_llm.request.params.n", "vllm:request_params_n"),
        Family("otel_llm.request.params.max_tokens", "vllm:request_params_max_tokens"),
        Family("gen_ai.server.time_to_first_token", "vllm:time_to_first_token_seconds", buckets=I.VLLM_TTFT),
        Family("otel_llm.request.inter_token_latency", "vllm:inter_token_latency_seconds"),
        Family("gen_ai.server.time_per_output_token", "vllm:request_time_per_output_token_seconds", buckets=I.VLLM_ITL),
        Family("gen_ai.server.request.duration", "vllm:e2e_request_latency_seconds", buckets=I.VLLM_REQUEST_LATENCY),
        Family("otel_llm.request.queue.duration", "vllm:request_queue_time_seconds"),
        Family("otel_llm.request.inference.duration", "vllm:request_inference_time_seconds"),
        Family("otel_llm.request.prefill.duration", "vllm:request_prefill_time_seconds"),
        Family("otel_llm.request.decode.duration", "vllm:request_decode_time_seconds"),
        Family("otel_llm.request.preemptions", "vllm:request_num_preemptions"),
        Family("otel_llm.scheduler.waiting_by_reason", "vllm:num_requests_waiting_by_reason",
               {"otel_llm.waiting_reason": ("reason", _same)},
               help="Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
                    "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
                    "status). Sum of all reasons equals vllm:num_requests_waiting."),
        Family("otel_llm.external_prefix_cache.queries", "vllm:external_prefix_cache_queries"),
        Family("otel_llm.external_prefix_cache.hits", "vllm:external_prefix_cache_hits"),
        Family("otel_llm.usage.prompt_tokens_by_source", "vllm:prompt_tokens_by_source",
               {"otel_llm.prompt_source": ("source", _same)}),
        Family("otel_llm.usage.prompt_tokens_cached", "vllm:prompt_tokens_cached"),
        Family("otel_llm.request.prefill_kv_computed_tokens", "vllm:request_prefill_kv_computed_tokens"),
        *_vllm_spec_decode(num_speculative_tokens),
        *_vllm_kv_residency(kv_cache_metrics),
        Family("otel_llm.cache_config.info", "vllm:cache_config_info"),
        Family("otel_llm.lora.info", "vllm:lora_requests_info", help="Running stats on lora requests."),
        Family("otel_llm.telemetry.dropped", "otel_llm_telemetry_dropped"),
        Family("otel_llm.admission.rejections", "vllm:admission_rejections",
               {"otel_llm.rejection_reason": ("reason", _same)}, base=(("model_name", "model"),)),  # a frontend's: no engine
        *HIDDEN_VLLM.get(hidden_version(hidden), ()),
    ]
    return Profile("vllm", "model_name", "engine", _with_custom(fams, custom), True)


def prometheus_name(inst: I.Instrument) -> str:
    """The OTel -> Prometheus translation of a canonical name (without `_total`)."""
    return metric_name(inst.name, inst.unit, inst.kind)


def _otel(table: dict[str, I.Instrument], custom: dict[str, tuple[float, ...]], spec_decode: bool,
          kv_cache_metrics: bool = False) -> Profile:
    error_type = {"otel_llm.finish_reason": ("error_type", lambda r: r if r in ("abort", "error") else None)}
    fams = []
    for inst in table.values():
        if inst.name in ("otel_llm.cache_config.info", "otel_llm.lora.info"):
            continue  # vLLM-isms; the OTel way: resource attributes, per-adapter counts (otel_llm.lora.requests)
        if inst.name.startswith(I.SPEC_DECODE) and not spec_decode:
            continue  # no speculative decoding configured (as the `vllm` profile, and OTLP while they are 0)
        if inst.name.startswith(I.KV_BLOCK) and not kv_cache_metrics:
            continue  # --kv-cache-metrics off (as the `vllm` profile and OTLP)
        labels: LabelMap = {d: (d.replace(".", "_"), _same) for d in inst.dims}
        if inst.name == "gen_ai.server.request.duration":
            labels.update(error_type)
        elif "otel_llm.finish_reason" in inst.dims:
            labels["otel_llm.finish_reason"] = ("otel_llm_finish_reason", _same)
        buckets = {"gen_ai.server.time_to_first_token": I.SEMCONV_TTFT,
                   "gen_ai.server.time_per_output_token": I.SEMCONV_TPOT,
                   "gen_ai.server.request.duration": I.SEMCONV_DURATION}.get(inst.name)
        fams.append(Family(inst.name, prometheus_name(inst), labels, buckets))
    return Profile("otel", "gen_ai_request_model", "otel_llm_engine", _with_custom(fams, custom), False)


PROFILE_NAMES = ("vllm", "otel", "sglang", "tgi", "triton")


def get_profile(name: str, max_model_len: int = 8192, custom: dict[str, tuple[float, ...]] | None = None,
                hidden: str | None = None, num_speculative_tokens: int = 0, kv_cache_metrics: bool = False,
                stage_replica: bool = False) -> Profile:
    """A profile's table. `custom`: canonical histogram -> the operator's buckets (`vllm` and `otel`
    only: the other profiles copy servers with their own bucket flags); `hidden`: the
    `--show-hidden-metrics-for-version` value (`vllm` only); `num_speculative_tokens`: 0 leaves
    the spec-decode families out (`vllm`, `otel`); `kv_cache_metrics`: vLLM's `--kv-cache-metrics`
    residency histograms (`vllm`, `otel`); `stage_replica`: vLLM-Omni's reshape of the engine
    label into `stage` + `replica` (`vllm`, `otel`: the profiles whose base labels are model, engine)."""
    if stage_replica:
        return replace(get_profile(name, max_model_len, custom, hidden, num_speculative_tokens, kv_cache_metrics),
                       stage_replica=True)
    custom = custom or {}
    if name == "vllm":
        return _vllm(custom, hidden, num_speculative_tokens, kv_cache_metrics)
    if name == "otel":
        return _otel(I.instrument_table(max_model_len), custom, num_speculative_tokens > 0, kv_cache_metrics)
    if name == "sglang":
        from .profile_sglang import sglang_profile
        return sglang_profile(max_model_len)
    if name == "tgi":
        from .profile_tgi import tgi_profile
        return tgi_profile(max_model_len)
    if name == "triton":
        from .profile_triton import triton_profile
        return triton_profile(max_model_len)
    raise ValueError(f"unknown metrics profile {name!r}; expected one of {PROFILE_NAMES}")


def resolve_custom_buckets(overrides: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
    """`--custom-histogram-buckets` names (vLLM bucket family, vLLM histogram, canonical histogram)
    -> {canonical histogram: bounds}; ValueError naming an unknown one."""
    vllm_names = {f.name: f.canonical for fams in (_vllm({}, None, kv_cache_metrics=True).families,
                                                   *HIDDEN_VLLM.values()) for f in fams}
    histograms = [i.name for i in I.instrument_table(8192).values() if i.kind is I.Kind.HISTOGRAM]
    return custom_buckets.resolve(overrides, vllm_names, histograms)


def aggregation_table(max_model_len: int, custom: dict[str, tuple[float, ...]] | None = None
                      ) -> dict[str, I.Instrument]:
    """The canonical instruments, each histogram aggregating on every bound any profile exposes (so
    every profile re-buckets exactly, whichever one a scrape asks for). OTLP keeps the canonical
    bounds, or the operator's (`custom`: canonical name -> bounds)."""
    custom = custom or {}
    table = I.instrument_table(max_model_len)
    for name, bounds in custom.items():
        table[name] = replace(table[name], buckets=bounds)
    extra: dict[str, set[float]] = {}
    for name in PROFILE_NAMES:
        for fam in get_profile(name, max_model_len, custom).families:
            bounds = fam.canonical_buckets
            if bounds is not None and fam.canonical in table and not fam.part:
                extra.setdefault(fam.canonical, set()).update(bounds)
    for name, bounds in extra.items():
        inst = table[name]
        if not bounds <= set(inst.buckets):
            table[name] = replace(inst, buckets=tuple(sorted(bounds | set(inst.buckets))),
                                  export_buckets=inst.buckets)
    return table
