"""The one table that defines every instrument.

Canonical names are OTel GenAI semconv names where semconv defines the
instrument (`gen_ai.server.*`) and the project namespace `otel_llm.*` for the
rest. Every instrument carries the base attributes of its `Telemetry`
(`gen_ai.request.model`, `otel_llm.engine`) plus the per-request dimensions in
`dims` (each with a fixed, small vocabulary: cardinality is bounded by
construction). Histograms aggregate on `buckets`; a shim profile may expose
coarser boundaries as long as they are a subset (see `profiles.py`). The one
attribute with outside values, `otel_llm.lora.adapter` (and the info gauge's
adapter lists), is bounded by the cardinality limit (`cardinality.py`, `lora.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from otel_llm.engine.step import FINISH_REASON_LABELS, MAX_SPEC_POSITIONS


class Kind(Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


# Base attributes on every point of a Telemetry (the profiles' model and engine labels).
MODEL_ATTRIBUTE = "gen_ai.request.model"
ENGINE_ATTRIBUTE = "otel_llm.engine"
PROVIDER_ATTRIBUTE = "gen_ai.provider.name"
CACHE_CONFIG_INFO = "otel_llm.cache_config.info"
CACHE_CONFIG_PREFIX = "otel_llm.cache_config."  # + key: the cache config's entries on its info point
LORA_INFO = "otel_llm.lora.info"  # vllm:lora_requests_info
LORA_REQUESTS = "otel_llm.lora.requests"
ADAPTER_ATTRIBUTE = "otel_llm.lora.adapter"  # on otel_llm.lora.requests points: the adapter's name
DEFAULT_MODEL_VERSION = "1"  # the model version a server reports unless told (Triton's `version`; OTLP has none)

# Per-request dimensions and their vocabularies (index = the value stored per request).
OPERATIONS = ("chat", "text_completion", "generate_content", "_OTHER")
STREAM = ("false", "true")  # whether the response was streamed (SGLang's `is_streaming`)
# The request-level SLO objectives goodput judges (otel_llm.slo.goodput), and the bounded vocabulary of
# what a request missed: index = bit mask over GOODPUT_KINDS, "none" = met every objective.
GOODPUT_KINDS = ("ttft", "tpot", "e2e", "errors")
SLO_MISSED = tuple("+".join(k for b, k in enumerate(GOODPUT_KINDS) if m >> b & 1) or "none"
                   for m in range(1 << len(GOODPUT_KINDS)))
DIMENSIONS = {
    "gen_ai.operation.name": OPERATIONS,
    "otel_llm.stream": STREAM,
    "otel_llm.finish_reason": FINISH_REASON_LABELS,
    "otel_llm.waiting_reason": ("capacity", "deferred"),  # vLLM's reasons; they sum to the waiting requests
    "otel_llm.prompt_source": ("local_compute", "local_cache_hit", "external_kv_transfer"),  # vLLM's, summing to the prompt
    "otel_llm.spec_decode.position": tuple(str(i) for i in range(MAX_SPEC_POSITIONS)),  # draft positions
    "otel_llm.rejection_reason": ("max_num_queued_reqs", "max_num_queued_tokens"),  # vLLM's admission limits
    "otel_llm.slo.missed": SLO_MISSED,
    # vLLM's CacheHitSource: the tier that supplied prefix-cache hits (device: this engine's own cache)
    "otel_llm.cache_source": ("device", "host", "p2p", "disk", "external_unspecified"),
    "otel_llm.sleep_state": ("awake", "weights_offloaded", "discard_all"),  # vLLM's engine sleep levels 0, 1, 2
}


SPEC_DECODE = "otel_llm.spec_decode."  # the speculative-decoding instruments' prefix: shown only where it is in use
KV_BLOCK = "otel_llm.kv_block."  # the KV residency histograms' prefix: shown only with --kv-cache-metrics
SLO = "otel_llm.slo."  # goodput's prefix: shown only with an SLO configuration
PERF = "otel_llm.engine.estimated_"  # vLLM's MFU estimates' prefix: shown only with --enable-mfu-metrics
PERF_COUNTERS = tuple(PERF + what for what in ("flops", "read_bytes", "write_bytes"))  # vLLM's PerfStats' order
SLEEP_STATE = "otel_llm.engine.sleep_state"  # set only by a source with a sleep mode (vLLM)
# Counters exported with every series from the start, zeros included (vLLM pre-creates their
# children, so a collector re-serving them shows the family before the first event)
DECLARED_AT_ZERO = frozenset({"otel_llm.admission.rejections", "otel_llm.prefix_cache.hits_by_source"})


def request_series(operation: int, stream: bool) -> int:
    """A request's series index over the per-request dimensions (operation, stream)."""
    return operation * len(STREAM) + int(bool(stream))


def _build_1_2_5(max_value: int) -> tuple[float, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... <= max_value."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return tuple(float(x) for x in out)
            out.append(v)
        exp += 1


# vLLM bucket families (vllm/v1/metrics/buckets.py) and the GenAI semconv advisories.
VLLM_REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            20.0, 40.0, 80.0)
VLLM_ITERATION_TOKENS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
                         8192.0, 16384.0)
VLLM_PARAMS_N = (1.0, 2.0, 5.0, 10.0, 20.0)
VLLM_NUM_PREEMPTIONS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
VLLM_KV_CACHE_RESIDENCY = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0,
                           30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)
SEMCONV_DURATION = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                    81.92)
SEMCONV_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0)
SEMCONV_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


def union(*families: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(sorted(set().union(*families)))


@dataclass(frozen=True)
class Instrument:
    """One instrument: canonical OTel name, kind, UCUM unit, description, aggregation buckets."""

    name: str
    kind: Kind
    unit: str
    description: str
    buckets: tuple[float, ...] = ()
    dims: tuple[str, ...] = ()  # per-request dimensions, keys of DIMENSIONS
    exemplars: bool = False  # keep the trace of the latest sampled request per bucket
    export_buckets: tuple[float, ...] | None = None  # OTLP's bounds (a subset); None: `buckets`

    @property
    def otlp_buckets(self) -> tuple[float, ...]:
        return self.buckets if self.export_buckets is None else self.export_buckets

    @property
    def num_series(self) -> int:
        n = 1
        for d in self.dims:
            n *= len(DIMENSIONS[d])
        return n


def instrument_table(max_model_len: int) -> dict[str, Instrument]:
    """Every instrument of a `Telemetry`; request-token buckets depend on max_model_len."""
    tokens = _build_1_2_5(max_model_len)
    op = ("gen_ai.operation.name", "otel_llm.stream")
    op_reason = op + ("otel_llm.finish_reason",)
    C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
    table = [
        Instrument("otel_llm.scheduler.running", G, "{request}", "Number of requests in model execution batches."),
        Instrument("otel_llm.scheduler.waiting", G, "{request}", "Number of requests waiting to be processed."),
        Instrument("otel_llm.kv_cache.usage", G, "1", "KV-cache usage. 1 means 100 percent usage."),
        Instrument("otel_llm.prefix_cache.queries", C, "{token}", "Prefix cache queries, in terms of number of queried tokens."),
        Instrument("otel_llm.prefix_cache.hits", C, "{token}", "Prefix cache hits, in terms of number of cached tokens."),
        Instrument("otel_llm.scheduler.preemptions", C, "{preemption}", "Cumulative number of preemption from the engine."),
        Instrument("otel_llm.usage.prompt_tokens", C, "{token}", "Number of prefill tokens processed."),
        Instrument("otel_llm.usage.generation_tokens", C, "{token}", "Number of generation tokens processed."),
        Instrument("otel_llm.request.finished", C, "{request}", "Count of finished requests, by finish reason.", dims=op_reason),
        Instrument("otel_llm.request.prompt_tokens", H, "{token}", "Number of prefill tokens processed.", tokens, op, True),
        Instrument("otel_llm.request.generation_tokens", H, "{token}", "Number of generation tokens processed.", tokens, op, True),
        Instrument("otel_llm.step.tokens", H, "{token}", "Number of tokens per engine_step.", VLLM_ITERATION_TOKENS),
        Instrument("otel_llm.request.max_generation_tokens", H, "{token}", "Histogram of maximum number of requested generation tokens.", tokens, op),
        Instrument("otel_llm.request.params.n", H, "1", "Histogram of the n request parameter.", VLLM_PARAMS_N, op),
        Instrument("otel_llm.request.params.max_tokens", H, "{token}", "Histogram of the max_tokens request parameter.", tokens, op),
        Instrument("gen_ai.server.time_to_first_token", H, "s", "Histogram of time to first token in seconds.", union(VLLM_TTFT, SEMCONV_TTFT), op, True),
        Instrument("otel_llm.request.inter_token_latency", H, "s", "Histogram of inter-token latency in seconds.", VLLM_ITL),
        Instrument("gen_ai.server.time_per_output_token", H, "s", "Histogram of time per output token in seconds.", union(VLLM_ITL, SEMCONV_TPOT), op, True),
        Instrument("gen_ai.server.request.duration", H, "s", "Histogram of e2e request latency in seconds.", union(VLLM_REQUEST_LATENCY, SEMCONV_DURATION), op_reason, True),
        Instrument("otel_llm.request.queue.duration", H, "s", "Histogram of time spent in WAITING phase for request.", VLLM_REQUEST_LATENCY, op, True),
        Instrument("otel_llm.request.inference.duration", H, "s", "Histogram of time spent in RUNNING phase for request.", VLLM_REQUEST_LATENCY, op, True),
        Instrument("otel_llm.request.prefill.duration", H, "s", "Histogram of time spent in PREFILL phase for request.", VLLM_REQUEST_LATENCY, op, True),
        Instrument("otel_llm.request.decode.duration", H, "s", "Histogram of time spent in DECODE phase for request.", VLLM_REQUEST_LATENCY, op, True),
        Instrument("otel_llm.request.preemptions", H, "{preemption}", "Number of preemptions per request.", VLLM_NUM_PREEMPTIONS, op),
        Instrument("otel_llm.scheduler.waiting_by_reason", G, "{request}", "Number of waiting requests by reason: capacity (waiting for scheduling capacity) or deferred (LoRA budget, KV transfer, blocked status); they sum to otel_llm.scheduler.waiting.", dims=("otel_llm.waiting_reason",)),
        Instrument("otel_llm.external_prefix_cache.queries", C, "{token}", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens."),
        Instrument("otel_llm.external_prefix_cache.hits", C, "{token}", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens."),
        Instrument("otel_llm.usage.prompt_tokens_by_source", C, "{token}", "Number of prompt tokens by source.", dims=("otel_llm.prompt_source",)),
        Instrument("otel_llm.usage.prompt_tokens_cached", C, "{token}", "Number of cached prompt tokens (local + external)."),
        Instrument("otel_llm.request.prefill_kv_computed_tokens", H, "{token}", "Histogram of new KV tokens computed during prefill (excluding cached tokens).", tokens, op),
        Instrument("otel_llm.spec_decode.drafts", C, "{draft}", "Number of spec decoding drafts."),
        Instrument("otel_llm.spec_decode.draft_tokens", C, "{token}", "Number of draft tokens."),
        Instrument("otel_llm.spec_decode.accepted_tokens", C, "{token}", "Number of accepted tokens."),
        Instrument("otel_llm.spec_decode.accepted_tokens_per_pos", C, "{token}", "Accepted tokens per draft position.", dims=("otel_llm.spec_decode.position",)),
        Instrument("otel_llm.kv_block.lifetime", H, "s", "Histogram of KV cache block lifetime from allocation to eviction. Sampled metrics (controlled by --kv-cache-metrics-sample).", VLLM_KV_CACHE_RESIDENCY),
        Instrument("otel_llm.kv_block.idle_before_evict", H, "s", "Histogram of idle time before KV cache block eviction. Sampled metrics (controlled by --kv-cache-metrics-sample).", VLLM_KV_CACHE_RESIDENCY),
        Instrument("otel_llm.kv_block.reuse_gap", H, "s", "Histogram of time gaps between consecutive KV cache block accesses. Only the most recent accesses are recorded (ring buffer). Sampled metrics (controlled by --kv-cache-metrics-sample).", VLLM_KV_CACHE_RESIDENCY),
        Instrument("otel_llm.cache_config.info", G, "1", "Information of the LLMEngine CacheConfig."),
        Instrument("otel_llm.lora.info", G, "s", "Running stats on lora requests: per combination of waiting and running adapters, the unix time it was last seen (vLLM's vllm:lora_requests_info; no OTLP export)."),
        Instrument("otel_llm.lora.requests", C, "{request}", "Requests that arrived naming a LoRA adapter, by adapter (attribute otel_llm.lora.adapter)."),
        Instrument("otel_llm.telemetry.dropped", C, "{record}", "Telemetry records dropped as invalid (unknown request, out of order, bad value)."),
        Instrument("otel_llm.slo.requests", C, "{request}", "Finished requests judged against their SLO objectives, by the objectives they missed (none: met every one; their rate is the goodput).", dims=op + ("otel_llm.slo.missed",)),
        Instrument("otel_llm.engine.estimated_flops", C, "{operation}", "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations)."),
        Instrument("otel_llm.engine.estimated_read_bytes", C, "By", "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations)."),
        Instrument("otel_llm.engine.estimated_write_bytes", C, "By", "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations)."),
        Instrument("otel_llm.prefix_cache.hits_by_source", C, "{token}", "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.", dims=("otel_llm.cache_source",)),
        Instrument("otel_llm.mm_cache.queries", C, "{item}", "Multi-modal cache queries, in terms of number of queried items."),
        Instrument("otel_llm.mm_cache.hits", C, "{item}", "Multi-modal cache hits, in terms of number of cached items."),
        Instrument(SLEEP_STATE, G, "{state}", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.", dims=("otel_llm.sleep_state",)),
        Instrument("otel_llm.admission.rejections", C, "{request}", "Number of admission attempts rejected by a queue limit, by reason.", dims=("otel_llm.rejection_reason",)),
    ]
    return {i.name: i for i in table}
