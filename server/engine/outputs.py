"""What one engine step hands back: per-sequence outputs plus the telemetry record."""

from __future__ import annotations

from dataclasses import dataclass

from otel_llm.engine.step import FinishReason


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One sequence's new tokens and text this step (or its finish, possibly with no tokens).

    `text_delta` is the newly completed text: text ending inside a UTF-8
    character, or that might be the start of a stop string, is held back until it
    is settled. `num_cached_tokens` is the request's prefix-cache hit at its first
    scheduling (0 until then).
    """

    rid: int
    seq_index: int
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_tokens: int


@dataclass(frozen=True, slots=True)
class StepOutput:
    """`outputs` of one `LLMEngine.step()`; `telemetry` is `StepRecorder.end_step_bytes()`
    (decode with `otel_llm.engine.step.StepRecord.from_bytes`), None when stats are off."""

    outputs: list[RequestOutput]
    telemetry: bytes | None
