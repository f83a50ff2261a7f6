"""The `triton` profile: Triton Inference Server's per-model metrics plus the TensorRT-LLM backend's.

Sources: triton-inference-server/core `73aad7c` `src/metrics.cc` (names, HELP, kinds),
`src/metric_model_reporter.{h,cc}` (labels `model`, `version`; failures by `reason`; default
first-response buckets {100, 500, 2000, 5000} ms), `src/infer_stats.cc` (what counts when);
server `docs/user_guide/metrics.md`; NVIDIA/TensorRT-LLM `triton_backend/inflight_batcher_llm/
src/custom_metrics_reporter/custom_metrics_reporter.cc` and `model_instance_state.cc` (the
`nv_trt_llm_*` and `nv_llm_*` families). prometheus-cpp style: no `_total`, text format only;
Triton creates every per-model series at model load, so they show at 0 (`emit_empty=True`).

Ours -> Triton's (Triton updates the request counters and latency sums on success only):
- `nv_inference_request_success`, `nv_inference_count`: finished stop / length / repetition.
- `nv_inference_request_failure{reason}`: abort -> CANCELED, error -> BACKEND.
- `nv_inference_exec_count`: engine steps that computed tokens (`otel_llm.step.tokens` count).
- `nv_inference_pending_request_count`: requests waiting for the scheduler.
- latency counters, the sums (in us) of: `request_duration` = e2e (arrival -> last response at
  the frontend), successes only; `queue_duration` = QUEUED -> first SCHEDULED;
  `compute_input_duration` = prefill (SCHEDULED -> first token); `compute_infer_duration` =
  decode (first -> last token): the same mapping as `TritonStats` (`$model_stat`). These three
  sum every request with complete engine timestamps, aborted ones included, and Triton truncates
  each request to whole us, we do not. (The TRT-LLM backend itself reports the whole executor
  time, queueing inside the engine included, as compute_infer.)
- `nv_inference_first_response_histogram_ms`: TTFT in ms, Triton's default buckets (it is
  off unless `--metrics-config histogram_latencies=true`; Triton observes whole ms).
- `nv_trt_llm_request_metrics{request_type}`: waiting, scheduled (= running).
- `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}`: fraction (KV usage), tokens_per
  (cache_config block_size), max (num_gpu_blocks; absent while unknown).
- `nv_llm_input_token_len` / `nv_llm_output_token_len{response_metric_type}`: prompt /
  generation tokens per finished request, buckets {10, 50, 100, 500, 1000}.

Triton has, we cannot produce: `nv_inference_compute_output_duration_us` (detokenization is not
timed), failure reasons REJECTED and OTHER (requests rejected before the engine are not in the
request table), the `*_summary_us` summaries, `nv_model_load_duration_secs`, response-cache,
GPU/CPU/pinned-memory families; from the TRT-LLM backend `request_type` active / max / context,
`kv_cache_block_type` used / free / reused, and the runtime-memory, inflight-batcher, general and
disaggregated-serving groups. We have, Triton lacks: inter-token latency, TPOT, e2e/queue/
prefill/decode histograms, prefix-cache queries/hits, preemptions, token counters, `n`,
max_tokens, and the finish reason of each success.
"""

from __future__ import annotations

from otel_llm.canonical.instruments import CACHE_CONFIG_INFO
from otel_llm.shim.profile import Profile, ProfileFamily

_SUCCESS = {"otel_llm.finish_reason": ("stop", "length", "repetition")}
_FAILURE = {"otel_llm.finish_reason": ("abort", "error")}
_REASON = {"otel_llm.finish_reason": ("reason", {"abort": "CANCELED", "error": "BACKEND"}.get)}
_US = 1e6
FIRST_RESPONSE_MS = (100.0, 500.0, 2000.0, 5000.0)  # metric_model_reporter.h: kFirstResponseHistogram
TOKEN_LEN = (10.0, 50.0, 100.0, 500.0, 1000.0)  # custom_metrics_reporter.cc: nv_llm_*_token_len


def _request_type(canonical: str, value: str) -> ProfileFamily:
    return ProfileFamily(canonical, "nv_trt_llm_request_metrics", const=(("request_type", value),),
                         help="TRT LLM request metrics")


def _kv_block(canonical: str, value: str, cache_key: tuple[str, ...] = ()) -> ProfileFamily:
    return ProfileFamily(canonical, "nv_trt_llm_kv_cache_block_metrics", const=(("kv_cache_block_type", value),),
                         cache_key=cache_key, help="TRT LLM KV cache block metrics")


def triton_profile(max_model_len: int) -> Profile:
    fams = [
        ProfileFamily("otel_llm.request.finished", "nv_inference_request_success", only=_SUCCESS,
                      help="Number of successful inference requests, all batch sizes"),
        ProfileFamily("otel_llm.request.finished", "nv_inference_request_failure", _REASON, only=_FAILURE,
                      help="Number of failed inference requests, all batch sizes"),
        ProfileFamily("otel_llm.request.finished", "nv_inference_count", only=_SUCCESS,
                      help="Number of inferences performed (does not include cached requests)"),
        ProfileFamily("otel_llm.step.tokens", "nv_inference_exec_count", part="count",
                      help="Number of model executions performed (does not include cached requests)"),
        ProfileFamily("gen_ai.server.request.duration", "nv_inference_request_duration_us", scale=_US, part="sum",
                      only=_SUCCESS, help="Cumulative inference request duration in microseconds (includes cached requests)"),
        ProfileFamily("otel_llm.request.queue.duration", "nv_inference_queue_duration_us", scale=_US, part="sum",
                      help="Cumulative inference queuing duration in microseconds (includes cached requests)"),
        ProfileFamily("otel_llm.request.prefill.duration", "nv_inference_compute_input_duration_us", scale=_US, part="sum",
                      help="Cumulative compute input duration in microseconds (does not include cached requests)"),
        ProfileFamily("otel_llm.request.decode.duration", "nv_inference_compute_infer_duration_us", scale=_US, part="sum",
                      help="Cumulative compute inference duration in microseconds (does not include cached requests)"),
        ProfileFamily("otel_llm.scheduler.waiting", "nv_inference_pending_request_count",
                      help="Instantaneous number of pending requests awaiting execution per-model."),
        ProfileFamily("gen_ai.server.time_to_first_token", "nv_inference_first_response_histogram_ms",
                      buckets=FIRST_RESPONSE_MS, scale=1e3, help="Duration from request to first response in milliseconds"),
        _request_type("otel_llm.scheduler.waiting", "waiting"),
        _request_type("otel_llm.scheduler.running", "scheduled"),
        _kv_block("otel_llm.kv_cache.usage", "fraction"),
        _kv_block(CACHE_CONFIG_INFO, "tokens_per", ("block_size",)),
        _kv_block(CACHE_CONFIG_INFO, "max", ("num_gpu_blocks",)),
        ProfileFamily("otel_llm.request.prompt_tokens", "nv_llm_input_token_len", buckets=TOKEN_LEN,
                      const=(("response_metric_type", "total_input_tokens"),), help="TRT LLM response metrics"),
        ProfileFamily("otel_llm.request.generation_tokens", "nv_llm_output_token_len", buckets=TOKEN_LEN,
                      const=(("response_metric_type", "total_output_tokens"),), help="TRT LLM response metrics"),
    ]
    return Profile("triton", "model", "version", tuple(fams), True,
                   base=(("model", "model"), ("version", "version")), counter_suffix="", openmetrics=False)
