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

from dataclasses import replace

from otel_llm.canonical import instruments as I
from otel_llm.shim import custom_buckets
from otel_llm.shim.otel import otel_profile, prometheus_name
from otel_llm.shim.profile import Profile, ProfileFamily, same
from otel_llm.shim.sglang import sglang_profile
from otel_llm.shim.tgi import tgi_profile
from otel_llm.shim.triton import triton_profile
from otel_llm.shim.vllm import HIDDEN_VLLM, vllm_profile
from otel_llm.slo.goodput import GOODPUT

PROFILE_NAMES = ("vllm", "otel", "sglang", "tgi", "triton")


def get_profile(name: str, max_model_len: int = 8192, custom: dict[str, tuple[float, ...]] | None = None,
                hidden: str | None = None, num_speculative_tokens: int = 0, kv_cache_metrics: bool = False,
                stage_replica: bool = False, goodput: bool = False, mfu_metrics: bool = False) -> Profile:
    """A profile's table. `custom`: canonical histogram -> the operator's buckets (`vllm` and `otel`
    only: the other profiles copy servers with their own bucket flags); `hidden`: the
    `--show-hidden-metrics-for-version` value (`vllm` only); `num_speculative_tokens`: 0 leaves
    the spec-decode families out (`vllm`, `otel`); `kv_cache_metrics`: vLLM's `--kv-cache-metrics`
    residency histograms (`vllm`, `otel`); `stage_replica`: vLLM-Omni's reshape of the engine
    label into `stage` + `replica` (`vllm`, `otel`: the profiles whose base labels are model, engine);
    `goodput`: with SLO objectives, `otel_llm_slo_requests` (every profile; no server has a name for it);
    `mfu_metrics`: vLLM's `--enable-mfu-metrics` estimates (`vllm`, `otel`)."""
    if goodput:
        p = get_profile(name, max_model_len, custom, hidden, num_speculative_tokens, kv_cache_metrics, stage_replica,
                        mfu_metrics=mfu_metrics)
        return replace(p, families=(*p.families, goodput_family(p.name)))
    if stage_replica:
        return replace(get_profile(name, max_model_len, custom, hidden, num_speculative_tokens, kv_cache_metrics,
                                   mfu_metrics=mfu_metrics), stage_replica=True)
    custom = custom or {}
    if name == "vllm":
        return vllm_profile(custom, hidden, num_speculative_tokens, kv_cache_metrics, mfu_metrics)
    if name == "otel":
        return otel_profile(I.instrument_table(max_model_len), custom, num_speculative_tokens > 0, kv_cache_metrics,
                            mfu_metrics)
    if name == "sglang":
        return sglang_profile(max_model_len)
    if name == "tgi":
        return tgi_profile(max_model_len)
    if name == "triton":
        return triton_profile(max_model_len)
    raise ValueError(f"unknown metrics profile {name!r}; expected one of {PROFILE_NAMES}")


def goodput_family(profile_name: str) -> ProfileFamily:
    """`otel_llm.slo.requests` in a profile: the `otel` profile's attributes as labels, elsewhere the
    profile's base labels and `missed`."""
    inst = I.instrument_table(8192)[GOODPUT]
    if profile_name == "otel":
        return ProfileFamily(GOODPUT, prometheus_name(inst), {d: (d.replace(".", "_"), same) for d in inst.dims})
    return ProfileFamily(GOODPUT, prometheus_name(inst), {"otel_llm.slo.missed": ("missed", same)})


def resolve_custom_buckets(overrides: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
    """`--custom-histogram-buckets` names (vLLM bucket family, vLLM histogram, canonical histogram)
    -> {canonical histogram: bounds}; ValueError naming an unknown one."""
    vllm_names = {f.name: f.canonical for fams in (vllm_profile({}, None, kv_cache_metrics=True).families,
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
