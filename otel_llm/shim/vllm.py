"""The `vllm` profile: exactly vLLM's `PrometheusStatLogger` names, types, labels (`model_name`,
`engine`, `finished_reason`) and buckets, the families vLLM hid behind
`--show-hidden-metrics-for-version`, and those declared only with speculative decoding or
`--kv-cache-metrics`.
"""

from __future__ import annotations

from otel_llm.canonical import instruments as I
from otel_llm.shim.profile import Profile, ProfileFamily, same, with_custom

# Families vLLM renamed or removed, by the `--show-hidden-metrics-for-version` value that showed them
# again (vLLM: "deprecated in X.Y, hidden in X.Y+1, re-enabled with =X.Y, removed in X.Y+2"; the gpu_
# names, deprecated in 0.9.2, were hidden in 0.11 behind =0.10). Values from the canonical data.
HIDDEN_VLLM = {
    "0.8": (ProfileFamily("otel_llm.request.queue.duration", "vllm:time_in_queue_requests",
                          help="Histogram of time the request spent in the queue in seconds."),),
    "0.10": (ProfileFamily("otel_llm.kv_cache.usage", "vllm:gpu_cache_usage_perc",
                           help="GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc "
                         "instead."),
             ProfileFamily("otel_llm.prefix_cache.queries", "vllm:gpu_prefix_cache_queries",
                           help="GPU prefix cache queries, in terms of number of queriedtokens. DEPRECATED: Use "
                         "vllm:prefix_cache_queries instead."),
             ProfileFamily("otel_llm.prefix_cache.hits", "vllm:gpu_prefix_cache_hits",
                           help="GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: Use "
                         "vllm:prefix_cache_hits instead.")),
    "0.11": (ProfileFamily("otel_llm.request.inter_token_latency", "vllm:time_per_output_token_seconds",
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


def _vllm_spec_decode(k: int) -> tuple[ProfileFamily, ...]:
    """vLLM's `SpecDecodingProm`: declared only when speculative decoding is configured, with one
    per-position series for each of its k draft positions (`num_speculative_tokens`)."""
    if k <= 0:
        return ()
    position = "otel_llm.spec_decode.position"
    return (ProfileFamily("otel_llm.spec_decode.drafts", "vllm:spec_decode_num_drafts"),
            ProfileFamily("otel_llm.spec_decode.draft_tokens", "vllm:spec_decode_num_draft_tokens"),
            ProfileFamily("otel_llm.spec_decode.accepted_tokens", "vllm:spec_decode_num_accepted_tokens"),
            ProfileFamily("otel_llm.spec_decode.accepted_tokens_per_pos", "vllm:spec_decode_num_accepted_tokens_per_pos",
                          {position: ("position", same)}, only={position: I.DIMENSIONS[position][:k]}))


def _vllm_kv_residency(on: bool) -> tuple[ProfileFamily, ...]:
    """vLLM's `--kv-cache-metrics` histograms: declared only when it is on."""
    return (ProfileFamily("otel_llm.kv_block.lifetime", "vllm:kv_block_lifetime_seconds"),
            ProfileFamily("otel_llm.kv_block.idle_before_evict", "vllm:kv_block_idle_before_evict_seconds"),
            ProfileFamily("otel_llm.kv_block.reuse_gap", "vllm:kv_block_reuse_gap_seconds")) if on else ()


def _vllm_perf(on: bool) -> tuple[ProfileFamily, ...]:
    """vLLM's `PerfMetricsProm` (`--enable-mfu-metrics`): declared only when it is on."""
    return (ProfileFamily("otel_llm.engine.estimated_flops", "vllm:estimated_flops_per_gpu"),
            ProfileFamily("otel_llm.engine.estimated_read_bytes", "vllm:estimated_read_bytes_per_gpu"),
            ProfileFamily("otel_llm.engine.estimated_write_bytes", "vllm:estimated_write_bytes_per_gpu")) if on else ()


def vllm_profile(custom: dict[str, tuple[float, ...]], hidden: str | None, num_speculative_tokens: int = 0,
          kv_cache_metrics: bool = False, mfu_metrics: bool = False) -> Profile:
    reason = {"otel_llm.finish_reason": ("finished_reason", same)}
    fams = [
        ProfileFamily("otel_llm.scheduler.running", "vllm:num_requests_running"),
        ProfileFamily("otel_llm.scheduler.waiting", "vllm:num_requests_waiting"),
        ProfileFamily("otel_llm.kv_cache.usage", "vllm:kv_cache_usage_perc"),
        ProfileFamily("otel_llm.prefix_cache.queries", "vllm:prefix_cache_queries"),
        ProfileFamily("otel_llm.prefix_cache.hits", "vllm:prefix_cache_hits"),
        ProfileFamily("otel_llm.scheduler.preemptions", "vllm:num_preemptions"),
        ProfileFamily("otel_llm.usage.prompt_tokens", "vllm:prompt_tokens"),
        ProfileFamily("otel_llm.usage.generation_tokens", "vllm:generation_tokens"),
        ProfileFamily("otel_llm.request.finished", "vllm:request_success", reason),
        ProfileFamily("otel_llm.request.prompt_tokens", "vllm:request_prompt_tokens"),
        ProfileFamily("otel_llm.request.generation_tokens", "vllm:request_generation_tokens"),
        ProfileFamily("otel_llm.step.tokens", "vllm:iteration_tokens_total"),
        ProfileFamily("otel_llm.request.max_generation_tokens", "vllm:request_max_num_generation_tokens"),
        ProfileFamily("otel_llm.request.params.n", "vllm:request_params_n"),
        ProfileFamily("otel_llm.request.params.max_tokens", "vllm:request_params_max_tokens"),
        ProfileFamily("gen_ai.server.time_to_first_token", "vllm:time_to_first_token_seconds", buckets=I.VLLM_TTFT),
        ProfileFamily("otel_llm.request.inter_token_latency", "vllm:inter_token_latency_seconds"),
        ProfileFamily("gen_ai.server.time_per_output_token", "vllm:request_time_per_output_token_seconds", buckets=I.VLLM_ITL),
        ProfileFamily("gen_ai.server.request.duration", "vllm:e2e_request_latency_seconds", buckets=I.VLLM_REQUEST_LATENCY),
        ProfileFamily("otel_llm.request.queue.duration", "vllm:request_queue_time_seconds"),
        ProfileFamily("otel_llm.request.inference.duration", "vllm:request_inference_time_seconds"),
        ProfileFamily("otel_llm.request.prefill.duration", "vllm:request_prefill_time_seconds"),
        ProfileFamily("otel_llm.request.decode.duration", "vllm:request_decode_time_seconds"),
        ProfileFamily("otel_llm.request.preemptions", "vllm:request_num_preemptions"),
        ProfileFamily("otel_llm.scheduler.waiting_by_reason", "vllm:num_requests_waiting_by_reason",
                      {"otel_llm.waiting_reason": ("reason", same)},
                      help="Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
                    "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
                    "status). Sum of all reasons equals vllm:num_requests_waiting."),
        ProfileFamily("otel_llm.external_prefix_cache.queries", "vllm:external_prefix_cache_queries"),
        ProfileFamily("otel_llm.external_prefix_cache.hits", "vllm:external_prefix_cache_hits"),
        ProfileFamily("otel_llm.usage.prompt_tokens_by_source", "vllm:prompt_tokens_by_source",
                      {"otel_llm.prompt_source": ("source", same)}),
        ProfileFamily("otel_llm.usage.prompt_tokens_cached", "vllm:prompt_tokens_cached"),
        ProfileFamily("otel_llm.prefix_cache.hits_by_source", "vllm:prompt_tokens_cached_by_source",
                      {"otel_llm.cache_source": ("source", same)}),
        ProfileFamily("otel_llm.mm_cache.queries", "vllm:mm_cache_queries"),
        ProfileFamily("otel_llm.mm_cache.hits", "vllm:mm_cache_hits"),
        ProfileFamily(I.SLEEP_STATE, "vllm:engine_sleep_state", {"otel_llm.sleep_state": ("sleep_state", same)}),
        ProfileFamily("otel_llm.request.prefill_kv_computed_tokens", "vllm:request_prefill_kv_computed_tokens"),
        *_vllm_spec_decode(num_speculative_tokens),
        *_vllm_kv_residency(kv_cache_metrics),
        *_vllm_perf(mfu_metrics),
        ProfileFamily("otel_llm.cache_config.info", "vllm:cache_config_info"),
        ProfileFamily("otel_llm.lora.info", "vllm:lora_requests_info", help="Running stats on lora requests."),
        ProfileFamily("otel_llm.telemetry.dropped", "otel_llm_telemetry_dropped"),
        ProfileFamily("otel_llm.admission.rejections", "vllm:admission_rejections",
                      {"otel_llm.rejection_reason": ("reason", same)}, base=(("model_name", "model"),)),  # a frontend's: no engine
        *HIDDEN_VLLM.get(hidden_version(hidden), ()),
    ]
    return Profile("vllm", "model_name", "engine", with_custom(fams, custom), True)
