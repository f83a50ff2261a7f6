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
from dataclasses import dataclass, field

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
    buckets: tuple[float, ...] | None = None  # None: the canonical buckets


@dataclass(frozen=True)
class Profile:
    name: str
    model_label: str
    engine_label: str
    families: tuple[Family, ...]
    emit_empty: bool  # vLLM pre-creates every labelled child; OTel exports only series with data


def _vllm() -> Profile:
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
        Family("otel_llm.cache_config.info", "vllm:cache_config_info"),
        Family("otel_llm.telemetry.dropped", "otel_llm_telemetry_dropped"),
    ]
    return Profile("vllm", "model_name", "engine", tuple(fams), True)


def prometheus_name(inst: I.Instrument) -> str:
    """The OTel -> Prometheus translation of a canonical name (without `_total`)."""
    return metric_name(inst.name, inst.unit, inst.kind)


def _otel(table: dict[str, I.Instrument]) -> Profile:
    error_type = {"otel_llm.finish_reason": ("error_type", lambda r: r if r in ("abort", "error") else None)}
    fams = []
    for inst in table.values():
        if inst.name == "otel_llm.cache_config.info":
            continue  # a vLLM-ism; the OTel way is resource attributes
        labels: LabelMap = {d: (d.replace(".", "_"), _same) for d in inst.dims}
        if inst.name == "gen_ai.server.request.duration":
            labels.update(error_type)
        elif "otel_llm.finish_reason" in inst.dims:
            labels["otel_llm.finish_reason"] = ("otel_llm_finish_reason", _same)
        buckets = {"gen_ai.server.time_to_first_token": I.SEMCONV_TTFT,
                   "gen_ai.server.time_per_output_token": I.SEMCONV_TPOT,
                   "gen_ai.server.request.duration": I.SEMCONV_DURATION}.get(inst.name)
        fams.append(Family(inst.name, prometheus_name(inst), labels, buckets))
    return Profile("otel", "gen_ai_request_model", "otel_llm_engine", tuple(fams), False)


def get_profile(name: str, max_model_len: int = 8192) -> Profile:
    if name == "vllm":
        return _vllm()
    if name == "otel":
        return _otel(I.instrument_table(max_model_len))
    raise ValueError(f"unknown metrics profile {name!r}; expected one of ('vllm', 'otel')")
