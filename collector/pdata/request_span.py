"""What an LLM request span says about its request: the vLLM-style latency attributes that
otel-llm's and vLLM's request spans carry (``gen_ai.latency.*``, seconds), whether it failed
(status ERROR or an ``error.type``, which otel-llm sets to ``abort`` or ``error``), and its finish
reason. Read by the tail sampler (what to keep) and the trace store (what to index).
"""

from __future__ import annotations

from typing import NamedTuple

from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

_LATENCY = {"gen_ai.latency.time_to_first_token": 0, "gen_ai.latency.e2e": 1, "gen_ai.latency.time_in_queue": 2}


class RequestFacts(NamedTuple):
    ttft_s: float | None
    e2e_s: float | None
    queue_s: float | None
    error: bool
    error_type: str | None  # "error" when the attribute is empty
    finish_reason: str | None  # first of gen_ai.response.finish_reasons
    is_request: bool  # it carries gen_ai.latency.* attributes


def request_facts(span: Span) -> RequestFacts:
    latency, error_type, finish_reason, is_request = [None, None, None], None, None, False
    for kv in span.attributes:
        key = kv.key
        if key.startswith("gen_ai.latency."):
            is_request = True
            if key in _LATENCY and kv.value.WhichOneof("value") in ("double_value", "int_value"):
                latency[_LATENCY[key]] = kv.value.double_value or float(kv.value.int_value)
        elif key == "error.type":
            error_type = kv.value.string_value or "error"
        elif key == "gen_ai.response.finish_reasons":
            values = kv.value.array_value.values
            finish_reason = values[0].string_value if values else kv.value.string_value or None
    error = span.status.code == Status.STATUS_CODE_ERROR or error_type is not None
    return RequestFacts(*latency, error, error_type, finish_reason, is_request)
