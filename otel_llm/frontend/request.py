"""What the frontend knows about a request when it arrives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

_set = object.__setattr__


@dataclass(frozen=True)
class RequestInfo:
    """A request as the frontend sees it at arrival (after tokenization).

    `operation` is the gen_ai operation name (`chat`, `text_completion`, ...).
    `trace_headers` may carry W3C `traceparent`/`tracestate`: the request span
    becomes their child. `input_messages` (a JSON string) is recorded only when
    content capture is opted in. `arrival_ns` lets a server stamp arrival at its edge
    (before body parsing and tokenization), on the same clock as the Telemetry's.
    `lora_name` is the LoRA adapter the request runs with (vLLM's `LoRARequest.lora_name`;
    None or "" for the base model): it is counted per adapter and, with
    `TelemetryConfig.max_loras`, listed in `vllm:lora_requests_info` while it waits or runs.
    """

    request_id: str
    prompt_tokens: int
    operation: str = "text_completion"
    max_tokens: int | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stream: bool = False
    stop_sequences: tuple[str, ...] = ()
    trace_headers: Mapping[str, str] | None = None
    input_messages: str | None = None
    arrival_ns: int | None = None  # frontend monotonic ns when the request arrived; None = now
    lora_name: str | None = None

    def __init__(self, request_id: str, prompt_tokens: int, operation: str = "text_completion",
                 max_tokens: int | None = None, n: int = 1, temperature: float | None = None,
                 top_p: float | None = None, top_k: int | None = None, seed: int | None = None,
                 stream: bool = False, stop_sequences: tuple[str, ...] = (),
                 trace_headers: Mapping[str, str] | None = None, input_messages: str | None = None,
                 arrival_ns: int | None = None, lora_name: str | None = None):
        # The fields in one store (made once per request; the dataclass's own __init__, one
        # object.__setattr__ per field as a frozen class needs, costs twice as much: ~2.5 us here).
        # A test holds the parameters equal to the fields, defaults included.
        _set(self, "__dict__", {
            "request_id": request_id, "prompt_tokens": prompt_tokens, "operation": operation,
            "max_tokens": max_tokens, "n": n, "temperature": temperature, "top_p": top_p, "top_k": top_k,
            "seed": seed, "stream": stream, "stop_sequences": stop_sequences, "trace_headers": trace_headers,
            "input_messages": input_messages, "arrival_ns": arrival_ns, "lora_name": lora_name})
