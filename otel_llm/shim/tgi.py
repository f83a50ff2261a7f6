"""The `tgi` profile: Text Generation Inference's router metrics, as TGI's `/metrics` writes them.

Source: huggingface/text-generation-inference `db931fcf`: `router/src/server.rs` (buckets and
descriptions, lines ~1937-2112), `router/src/validation.rs`, `router/src/infer/mod.rs`,
`backends/v3/src/{backend,queue,lib}.rs`. TGI's exporter (`metrics-exporter-prometheus`
0.15.3) shapes the exposition: no `_total` on counters, text format 0.0.4 only, no model label
(one router serves one model), a family only once it has been touched (`emit_empty=False`), and
HELP from the first `describe_*` of a name (so `tgi_request_duration` reads "Request duration",
not the later "Total time spent processing the request"); names never described get no HELP.

Buckets, as `server.rs` computes them: every name ending in `duration`: 0.0001 multiplied by 1.5
35 times, one bound per step (repeated multiplication, not 0.0001 * 1.5**k: 26 of the 35 bounds
differ in the last bits); `tgi_request_input_length`: 100 linear bounds up to
`max_input_tokens`; `tgi_request_generated_tokens` and `tgi_request_max_new_tokens`: 100 linear up
to `max_total_tokens`. We take `max_model_len` for both limits (TGI's defaults make
`max_input_tokens` = `max_total_tokens` - 1; one limit is what a vLLM-style engine has).

Ours -> TGI's, where the meanings differ:
- `tgi_request_count`: finished requests, all reasons (TGI counts arrivals, validation failures included).
- `tgi_request_success`: finished stop / length / repetition; `tgi_request_failure{err}`:
  abort -> `dropped` (TGI's name for a client that went away), error -> `generation`.
- `tgi_request_duration`: e2e, successes only (as TGI). `tgi_request_queue_duration`,
  `tgi_request_inference_duration` (first SCHEDULED -> last token) and
  `tgi_request_generated_tokens` count every finished request with the data; TGI records them
  for successes only (and input length and max new tokens at validation; we at finish).
- `tgi_request_mean_time_per_token_duration`: our TPOT (decode time / (tokens - 1)); TGI's
  is inference time / tokens, prefill included.
- `tgi_request_max_new_tokens`: the request's max generation tokens; TGI records
  min(max_new_tokens, its DEFAULT_GENERATION_LENGTH chunk).
- `tgi_batch_max_total_tokens`: block_size x num_gpu_blocks from the cache config (TGI: the
  KV capacity in tokens from warmup); absent while num_gpu_blocks is unknown.

TGI has, we cannot produce: `tgi_request_validation_duration` (tokenization is not timed),
`tgi_request_failure{err=validation|overloaded|template|incomplete}` (rejected before the
engine: not in the request table), `tgi_batch_current_max_tokens`, `tgi_batch_next_size`,
`tgi_batch_concat{reason}`, `tgi_batch_inference_{count,success,failure}{method}` and the
per-batch `tgi_batch_{forward,decode,filter,inference,concat}_duration{method}` histograms (the
engine step is not split into prefill/decode batches or timed per phase), and
`tgi_request_skipped_tokens` (speculation; a summary in TGI: no buckets are configured for it).
We have, TGI lacks: TTFT, inter-token latency, prefill/decode time per request, KV-cache
usage, prefix-cache queries/hits, preemptions, prompt/generation token counters, tokens per
step, `n`, and the finish reason of each request (TGI's success counter has no label).
"""

from __future__ import annotations

from otel_llm.canonical.instruments import CACHE_CONFIG_INFO
from otel_llm.shim.profile import Profile, ProfileFamily

_SUCCESS = {"otel_llm.finish_reason": ("stop", "length", "repetition")}
_FAILURE = {"otel_llm.finish_reason": ("abort", "error")}
_ERR = {"otel_llm.finish_reason": ("err", {"abort": "dropped", "error": "generation"}.get)}


def duration_buckets() -> tuple[float, ...]:
    """`server.rs`: `let mut value = 0.0001; for _ in 0..35 { value *= 1.5; push(value) }`."""
    out, value = [], 0.0001
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return tuple(out)


def linear_buckets(limit: int) -> tuple[float, ...]:
    """`server.rs`: `(0..100).map(|x| (limit as f64 / 100.0) * (x + 1) as f64)`."""
    return tuple((limit / 100.0) * (x + 1) for x in range(100))


def tgi_profile(max_model_len: int) -> Profile:
    dur, tokens = duration_buckets(), linear_buckets(max_model_len)
    fams = [
        ProfileFamily("otel_llm.scheduler.waiting", "tgi_queue_size", help="Current queue size"),
        ProfileFamily("otel_llm.scheduler.running", "tgi_batch_current_size", help="Current batch size"),
        # TGI describes "tgi_batch_total_tokens" but sets "tgi_batch_max_total_tokens": no HELP.
        ProfileFamily(CACHE_CONFIG_INFO, "tgi_batch_max_total_tokens", cache_key=("block_size", "num_gpu_blocks"),
                      help=""),
        ProfileFamily("otel_llm.request.finished", "tgi_request_count", help="Total number of requests"),
        ProfileFamily("otel_llm.request.finished", "tgi_request_success", only=_SUCCESS,
                      help="Number of successful requests"),
        ProfileFamily("otel_llm.request.finished", "tgi_request_failure", _ERR, only=_FAILURE, help=""),
        ProfileFamily("gen_ai.server.request.duration", "tgi_request_duration", buckets=dur, only=_SUCCESS,
                      help="Request duration"),
        ProfileFamily("otel_llm.request.queue.duration", "tgi_request_queue_duration", buckets=dur,
                      help="Request queue duration"),
        ProfileFamily("otel_llm.request.inference.duration", "tgi_request_inference_duration", buckets=dur,
                      help="Request inference duration"),
        ProfileFamily("gen_ai.server.time_per_output_token", "tgi_request_mean_time_per_token_duration", buckets=dur,
                      help="Mean time per token per request"),
        ProfileFamily("otel_llm.request.prompt_tokens", "tgi_request_input_length", buckets=tokens,
                      help="Input token length per request"),
        ProfileFamily("otel_llm.request.generation_tokens", "tgi_request_generated_tokens", buckets=tokens,
                      help="Generated tokens per request"),
        ProfileFamily("otel_llm.request.max_generation_tokens", "tgi_request_max_new_tokens", buckets=tokens,
                      help="Maximum new tokens per request"),
    ]
    return Profile("tgi", "", "", tuple(fams), False, base=(), counter_suffix="", openmetrics=False)
