"""What an LLM request span says about its request: the vLLM-style latency attributes that
otel-llm's and vLLM's request spans carry (``gen_ai.latency.*``, seconds), whether it failed
(status ERROR or an ``error.type``, which otel-llm sets to ``abort`` or ``error``), its finish
reason, its mean inter-token latency (decode time over the tokens after the first:
``gen_ai.latency.time_in_model_decode`` / (``gen_ai.usage.output_tokens``, vLLM's
``gen_ai.usage.completion_tokens``, - 1)), whether it was preempted (a ``preempted`` event), its
model, prompt tokens and LoRA adapter (``otel_llm.lora.adapter``).
Read by the tail sampler (what to keep) and the trace store (what to index).
"""

from __future__ import annotations

from typing import NamedTuple

from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

_LATENCY = {"gen_ai.latency.time_to_first_token": 0, "gen_ai.latency.e2e": 1, "gen_ai.latency.time_in_queue": 2}
_OUTPUT_TOKENS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")  # semconv's, vLLM's
_PROMPT_TOKENS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")


class RequestFacts(NamedTuple):
    ttft_s: float | None
    e2e_s: float | None
    queue_s: float | None
    error: bool
    error_type: str | None  # "error" when the attribute is empty
    finish_reason: str | None  # first of gen_ai.response.finish_reasons
    is_request: bool  # it carries gen_ai.latency.* attributes
    itl_s: float | None = None  # mean inter-token latency: None below two output tokens or without a decode time
    preempted: bool = False
    model: str | None = None  # gen_ai.request.model (vLLM's spans: gen_ai.response.model)
    prompt_tokens: int | None = None  # gen_ai.usage.input_tokens (vLLM's: gen_ai.usage.prompt_tokens)
    lora: str | None = None  # otel_llm.lora.adapter


def request_facts(span: Span) -> RequestFacts:
    latency, error_type, finish_reason, is_request = [None, None, None], None, None, False
    decode = tokens = model = prompt = lora = None
    for kv in span.attributes:
        key = kv.key
        if key.startswith("gen_ai.latency."):
            is_request = True
            if key in _LATENCY and kv.value.WhichOneof("value") in ("double_value", "int_value"):
                latency[_LATENCY[key]] = kv.value.double_value or float(kv.value.int_value)
            elif key == "gen_ai.latency.time_in_model_decode":
                decode = kv.value.double_value or float(kv.value.int_value)
        elif key in _OUTPUT_TOKENS:
            tokens = kv.value.int_value
        elif key == "gen_ai.request.model":
            model = kv.value.string_value or model
        elif key == "gen_ai.response.model":  # vLLM's spans name the model only here
            model = model or kv.value.string_value or None
        elif key in _PROMPT_TOKENS:
            prompt = kv.value.int_value
        elif key == "otel_llm.lora.adapter":
            lora = kv.value.string_value or None
        elif key == "error.type":
            error_type = kv.value.string_value or "error"
        elif key == "gen_ai.response.finish_reasons":
            values = kv.value.array_value.values
            finish_reason = values[0].string_value if values else kv.value.string_value or None
    error = span.status.code == Status.STATUS_CODE_ERROR or error_type is not None
    itl = decode / (tokens - 1) if is_request and decode is not None and tokens and tokens > 1 else None
    preempted = is_request and any(e.name == "preempted" for e in span.events)
    return RequestFacts(*latency, error, error_type, finish_reason, is_request, itl, preempted, model, prompt, lora)
