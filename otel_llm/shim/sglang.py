"""The `sglang` profile: SGLang 0.5's `/metrics` names, types, labels and buckets.

From `python/sglang/srt/observability/metrics_collector.py` (0.5.23): scheduler
families carry `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`; tokenizer
families `model_name, engine_type` (+ `is_streaming` where SGLang adds it). One
unified engine at rank 0 is what a single-process server is to SGLang
(`DisaggregationMode.to_engine_type` gives "unified" without PD disaggregation).
Label values as SGLang writes them: `is_streaming` is "true"/"false" (lower case),
`cache_source` "device" (the GPU radix cache, SGLang's value without HiCache).
SGLang's series appear on first use, so empty series are not emitted.

Semantics, where ours differ slightly from SGLang's:
- SGLang counts tokens and requests when a request finishes (`observe_one_finished_request`),
  so the `*_total` token counters come from the per-request histograms' sums, not from the
  per-step counters; every finish counts, aborts included, as in SGLang.
- `sglang:cached_tokens_total` is the engine's prefix-cache hits, counted when scheduled
  (SGLang: the request's cached tokens, counted at finish).
- `sglang:request_time_per_output_token_seconds`: SGLang observes it only for stop/length
  finishes with more than one token; ours is vLLM's (every request with tokens; 0 for one).
- `sglang:num_retracted_requests_total` is our preemptions (SGLang's name for them).
- `le` bounds from 1e6 on read `1000000.0` where prometheus_client writes `1e+06` (the same
  number to PromQL's functions; an exact `le="1e+06"` matcher would miss them).

What SGLang has that we cannot produce (no canonical data):
- windowed gauges SGLang computes per log interval: `gen_throughput`, `cache_hit_rate`,
  `num_retracted_reqs`, `utilization`, `new_token_ratio`, `decode_sum_seq_lens`, `spec_*`
  (SGLang's dashboard's throughput and hit-rate panels stay empty; `rate()` over
  `generation_tokens_total`, and `cached_tokens_total` over `prompt_tokens_total`, say the same);
- absolute KV-pool counts: `num_used_tokens`, `kv_{available,evictable,used}_tokens`; of the
  startup constants we have only the cache config's (`page_size`, `num_pages` and their
  product `max_total_num_tokens`), not `context_len`, memory or startup-time gauges;
- per-request derived values: `uncached_prompt_tokens_histogram`,
  `num_retracted_{input,output}_tokens_total`, `realtime_tokens_total{mode}`,
  `prefill_effective_tokens_total`, `per_stage_req_latency_seconds{stage}` (one SGLang
  family from several of our instruments), `num_so_requests_total` (structured output);
- subsystems we do not model: grammar, speculative decoding, PD disaggregation and KV
  transfer, HiCache/storage, LoRA pool, SWA/Mamba pools, EPLB, encoder (EPD), routing
  keys, CUDA graphs, forward/scheduler CPU timing, startup and memory gauges, HTTP
  request counters (`sglang:http_*`), `priority` and custom labels.

What we produce that SGLang lacks (served by the `vllm` and `otel` profiles): finish-reason
breakdown (SGLang counts only aborts), prefix-cache queries, per-step token counts, the
prefill/decode/inference phase durations, preemptions per request, requested max_tokens
and n, `gen_ai.operation.name`, and `is_streaming` on the token histograms.
"""

from __future__ import annotations

from otel_llm.canonical.instruments import CACHE_CONFIG_INFO
from otel_llm.shim.profile import Profile, ProfileFamily

_ENGINE = (("engine_type", "unified"),)  # TokenizerMetricsCollector: model_name, engine_type
_RANKS = _ENGINE + (("tp_rank", "0"), ("pp_rank", "0"), ("moe_ep_rank", "0"))  # SchedulerMetricsCollector
_STREAMING = {"otel_llm.stream": ("is_streaming", lambda v: v)}  # our "true"/"false" are SGLang's

# TokenizerMetricsCollector defaults (`default_bucket_prompt_tokens`, also the generation histogram's).
_TOKENS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500,
           15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000,
           300000, 400000, 600000, 800000, 1000000, 1100000)
_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
_E2E = _TTFT + (600, 1200, 1800, 2400)
_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
        0.200, 0.400, 0.600, 0.800, 1, 2, 4, 6, 8)  # also the per-request TPOT's
_QUEUE = (0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60,
          70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000,
          2500, 3000)  # SchedulerMetricsCollector.queue_time


def _f(bounds: tuple) -> tuple[float, ...]:
    return tuple(float(b) for b in bounds)


def sglang_profile(max_model_len: int) -> Profile:
    fams = [
        # SchedulerMetricsCollector (the first three are the gateway-api-inference-extension's)
        ProfileFamily("otel_llm.scheduler.running", "sglang:num_running_reqs", const=_RANKS,
                      help="The number of running requests."),
        ProfileFamily("otel_llm.scheduler.waiting", "sglang:num_queue_reqs", const=_RANKS,
                      help="The number of requests in the waiting queue."),
        ProfileFamily("otel_llm.kv_cache.usage", "sglang:token_usage", const=_RANKS, help="The token usage."),
        ProfileFamily("otel_llm.kv_cache.usage", "sglang:full_token_usage", const=_RANKS,
                      help="The token usage for full attention layers."),  # one full-attention pool: the same
        ProfileFamily("otel_llm.scheduler.preemptions", "sglang:num_retracted_requests", const=_RANKS,
                      help="Total number of retracted requests."),
        ProfileFamily("otel_llm.request.queue.duration", "sglang:queue_time_seconds", buckets=_f(_QUEUE), const=_RANKS,
                      help="Histogram of queueing time in seconds."),
        # startup constants (SGLang's emit_constants), from the cache config
        ProfileFamily(CACHE_CONFIG_INFO, "sglang:max_total_num_tokens", const=_RANKS,
                      cache_key=("block_size", "num_gpu_blocks"),  # SGLang: num_pages = this // page_size
                      help="Maximum total number of tokens in the KV cache pool."),
        ProfileFamily(CACHE_CONFIG_INFO, "sglang:page_size", const=_RANKS, cache_key=("block_size",),
                      help="KV cache page size in tokens."),
        ProfileFamily(CACHE_CONFIG_INFO, "sglang:num_pages", const=_RANKS, cache_key=("num_gpu_blocks",),
                      help="Number of KV cache pages."),
        # TokenizerMetricsCollector
        ProfileFamily("otel_llm.request.prompt_tokens", "sglang:prompt_tokens", _STREAMING, part="sum", const=_ENGINE,
                      help="Number of prefill tokens processed."),
        ProfileFamily("otel_llm.request.generation_tokens", "sglang:generation_tokens", _STREAMING, part="sum",
                      const=_ENGINE, help="Number of generation tokens processed."),
        ProfileFamily("otel_llm.request.prompt_tokens", "sglang:prompt_tokens_histogram", buckets=_f(_TOKENS),
                      const=_ENGINE, help="Histogram of prompt token length."),
        ProfileFamily("otel_llm.request.generation_tokens", "sglang:generation_tokens_histogram", buckets=_f(_TOKENS),
                      const=_ENGINE, help="Histogram of generation token length."),
        ProfileFamily("otel_llm.prefix_cache.hits", "sglang:cached_tokens", const=_ENGINE + (("cache_source", "device"),),
                      help="Number of cached prompt tokens by source (device/host/storage)."),
        ProfileFamily("otel_llm.request.finished", "sglang:num_requests", _STREAMING, const=_ENGINE,
                      help="Number of requests processed."),
        ProfileFamily("otel_llm.request.finished", "sglang:num_aborted_requests", const=_ENGINE,
                      only={"otel_llm.finish_reason": ("abort",)}, help="Number of requests aborted."),
        ProfileFamily("gen_ai.server.time_to_first_token", "sglang:time_to_first_token_seconds", _STREAMING, _f(_TTFT),
                      const=_ENGINE, help="Histogram of time to first token in seconds."),
        ProfileFamily("otel_llm.request.inter_token_latency", "sglang:inter_token_latency_seconds", buckets=_f(_ITL),
                      const=_ENGINE, help="Histogram of inter-token latency in seconds."),
        ProfileFamily("gen_ai.server.time_per_output_token", "sglang:request_time_per_output_token_seconds", _STREAMING,
                      _f(_ITL), const=_ENGINE,
                      help="Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1)."),
        ProfileFamily("gen_ai.server.request.duration", "sglang:e2e_request_latency_seconds", _STREAMING, _f(_E2E),
                      const=_ENGINE, help="Histogram of End-to-end request latency in seconds"),
    ]
    return Profile("sglang", "model_name", "", tuple(fams), False, base=(("model_name", "model"),))
