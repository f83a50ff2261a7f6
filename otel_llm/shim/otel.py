"""The `otel` profile: the canonical (semconv) names as the OTel Prometheus translation writes them
(dots -> `_`, unit suffix, `_total` on counters), attributes as labels.
"""

from __future__ import annotations

from otel_llm.canonical import instruments as I
from otel_llm.shim.profile import LabelMap, Profile, ProfileFamily, same, with_custom
from otel_llm.shim.prometheus_naming import metric_name


def prometheus_name(inst: I.Instrument) -> str:
    """The OTel -> Prometheus translation of a canonical name (without `_total`)."""
    return metric_name(inst.name, inst.unit, inst.kind)


def otel_profile(table: dict[str, I.Instrument], custom: dict[str, tuple[float, ...]], spec_decode: bool,
          kv_cache_metrics: bool = False, mfu_metrics: bool = False) -> Profile:
    error_type = {"otel_llm.finish_reason": ("error_type", lambda r: r if r in ("abort", "error") else None)}
    fams = []
    for inst in table.values():
        if inst.name in ("otel_llm.cache_config.info", "otel_llm.lora.info"):
            continue  # vLLM-isms; the OTel way: resource attributes, per-adapter counts (otel_llm.lora.requests)
        if inst.name.startswith(I.SPEC_DECODE) and not spec_decode:
            continue  # no speculative decoding configured (as the `vllm` profile, and OTLP while they are 0)
        if inst.name.startswith(I.KV_BLOCK) and not kv_cache_metrics:
            continue  # --kv-cache-metrics off (as the `vllm` profile and OTLP)
        if inst.name.startswith(I.PERF) and not mfu_metrics:
            continue  # --enable-mfu-metrics off (as the `vllm` profile and OTLP)
        if inst.name.startswith(I.SLO):
            continue  # goodput: only with SLO objectives (`profiles.goodput_family`)
        labels: LabelMap = {d: (d.replace(".", "_"), same) for d in inst.dims}
        if inst.name == "gen_ai.server.request.duration":
            labels.update(error_type)
        elif "otel_llm.finish_reason" in inst.dims:
            labels["otel_llm.finish_reason"] = ("otel_llm_finish_reason", same)
        buckets = {"gen_ai.server.time_to_first_token": I.SEMCONV_TTFT,
                   "gen_ai.server.time_per_output_token": I.SEMCONV_TPOT,
                   "gen_ai.server.request.duration": I.SEMCONV_DURATION}.get(inst.name)
        fams.append(ProfileFamily(inst.name, prometheus_name(inst), labels, buckets))
    return Profile("otel", "gen_ai_request_model", "otel_llm_engine", with_custom(fams, custom), False)
