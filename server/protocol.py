"""OpenAI API shapes: request bodies (pydantic, types only) and response builders.

Pydantic checks types and shapes (a wrong type is a 422); value checks (ranges,
empty lists, context length) are done by the handlers and answered with a 400
naming the field, as OpenAI does. Unknown fields are ignored. `top_k` and
`ignore_eos` are vLLM-style extras. OpenAI fields this server does not implement
are accepted only at a value that asks for nothing (`unsupported_field`).
Audio output (`modalities`, `audio`) is validated by `output_modalities` and
`audio_output`: `otel-llm serve` refuses it with a 400, `otel-llm serve-pipeline` makes it.

Response builders return plain JSON-ready dicts in OpenAI's exact schema; they
are called once per streamed chunk, so they stay as cheap as a dict literal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict

from otel_llm.server.audio_spec import (
    AUDIO_FORMATS, AUDIO_VOICES, MODALITIES, PCM16_SAMPLE_RATE_HZ, SUPPORTED_AUDIO_FORMAT,
)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    return_timings: bool | None = None  # otel-llm's: the `timings` object and `traceresponse` (None: the server's default)
    logprobs: Union[bool, int, None] = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None


class CompletionRequest(_SamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


# OpenAI's audio output (`ChatCompletionAudioParam`, `ChatCompletionModality` in the openai client's types).


class VoiceID(BaseModel):
    """A custom voice (`{"id": "voice_1234"}`): accepted by the schema, refused by `audio_output`."""
    model_config = ConfigDict(extra="ignore")
    id: str


class AudioParam(BaseModel):
    """`audio` of a chat request: both fields required, as OpenAI's `ChatCompletionAudioParam`."""
    model_config = ConfigDict(extra="ignore")
    voice: Union[str, VoiceID]
    format: str


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Union[str, dict, None] = None
    functions: list[Any] | None = None
    function_call: Union[str, dict, None] = None
    response_format: dict | None = None
    modalities: list[str] | None = None
    audio: AudioParam | None = None


# What this server does not implement, with the values besides None ("left out") that ask
# for nothing. Any other value would be silently ignored, changing what the client gets
# without telling it, so `unsupported_field` names it and the handlers answer 400.
# Compared with their types: a completions `logprobs` of 0 (chosen tokens' logprobs) is not False.
_NEUTRAL: dict[str, tuple] = {
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "tools": ([],),
    "tool_choice": ("none", "auto"),  # with no tools, "auto" is "none"
    "functions": ([],),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},),
    "audio": (),  # without "audio" in modalities: asks for nothing this server does
}


def unsupported_field(req: BaseModel) -> str | None:
    """The first field of `req` set to something this server does not do, else None."""
    for name, neutral in _NEUTRAL.items():
        value = getattr(req, name, None)
        if value is not None and not any(type(value) is type(n) and value == n for n in neutral):
            return name
    return None


def unencodable_field(value, path: str = "") -> str | None:
    """The field (`messages.0.content`, as validation errors name fields) of the first string in a
    request that UTF-8 cannot encode, else None. JSON's escapes allow a lone UTF-16 surrogate
    ("\\ud800"), which no tokenizer, encoder or exporter downstream can take: such a request is a 400
    naming the field, never a 500 or a lost span. ASCII strings cost one scan each; numbers and
    unset fields are passed over without a call."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode()
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, BaseModel):
        items = value.__dict__.items()  # the model's fields (extra ones are ignored, never stored)
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if isinstance(key, str) and not key.isascii() and unencodable_field(key) is not None:
            return f"{path or 'body'} (one of its keys)"  # the key is the bad string: not part of the name
        if item is None or item.__class__ in _SCALARS:
            continue
        found = unencodable_field(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


_SCALARS = frozenset((int, float, bool))


class InvalidField(ValueError):
    """A value OpenAI's API would refuse; `param` names the field (a 400)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class AudioOutput:
    """The audio a chat request asks for, validated: `voice` one of AUDIO_VOICES, `format` "pcm16"."""

    voice: str
    format: str


def output_modalities(req: ChatCompletionRequest) -> frozenset[str]:
    """What the response must hold ({"text"} when `modalities` is left out). Raises InvalidField for
    an unknown or empty `modalities`, and, when audio is asked for, for an `audio` this server cannot make."""
    if req.modalities is None:
        return frozenset(("text",))
    if not req.modalities:
        raise InvalidField("modalities", 'modalities must not be empty: use ["text"] or ["text", "audio"]')
    unknown = next((m for m in req.modalities if m not in MODALITIES), None)
    if unknown is not None:
        raise InvalidField("modalities", f"unknown modality {unknown!r} in modalities: the modalities are "
                                         f"{', '.join(map(repr, MODALITIES))}")
    if "audio" in req.modalities and req.audio is not None:
        _check_audio(req.audio)
    return frozenset(req.modalities)


def audio_output(req: ChatCompletionRequest) -> AudioOutput | None:
    """The validated audio request, or None for text only. Raises InvalidField as `output_modalities`
    does, and when "audio" is in `modalities` without `audio`."""
    if "audio" not in output_modalities(req):
        return None
    if req.audio is None:
        raise InvalidField("audio", 'modalities includes "audio", which requires the audio parameter: '
                                    f'{{"voice": "alloy", "format": "{SUPPORTED_AUDIO_FORMAT}"}}')
    return AudioOutput(req.audio.voice, req.audio.format)


def _check_audio(audio: AudioParam) -> None:
    if isinstance(audio.voice, VoiceID):
        raise InvalidField("audio.voice", f"custom voice {audio.voice.id!r} is not supported: use one of "
                                          f"{', '.join(AUDIO_VOICES)}")
    if audio.voice not in AUDIO_VOICES:
        raise InvalidField("audio.voice", f"unknown voice {audio.voice!r}: the voices are {', '.join(AUDIO_VOICES)}")
    if audio.format != SUPPORTED_AUDIO_FORMAT:
        known = "" if audio.format in AUDIO_FORMATS else f" (OpenAI's formats: {', '.join(AUDIO_FORMATS)})"
        raise InvalidField("audio.format", f"audio format {audio.format!r} is not supported{known}: this server "
                                           f"streams {SUPPORTED_AUDIO_FORMAT!r} only (16-bit PCM, "
                                           f"{PCM16_SAMPLE_RATE_HZ} Hz, mono)")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_response(rid: str, created: int, model: str, texts: list[str], reasons: list[str | None],
                        usage_: dict) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": i, "text": t, "logprobs": None, "finish_reason": r}
                    for i, (t, r) in enumerate(zip(texts, reasons))],
        "usage": usage_,
    }


def completion_chunk(rid: str, created: int, model: str, index: int, text: str, reason: str | None,
                     with_usage: bool) -> dict:
    chunk = {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": reason}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def chat_response(rid: str, created: int, model: str, texts: list[str], reasons: list[str | None],
                  usage_: dict) -> dict:
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "logprobs": None,
                     "finish_reason": r} for i, (t, r) in enumerate(zip(texts, reasons))],
        "usage": usage_,
    }


def chat_chunk(rid: str, created: int, model: str, index: int, delta: dict, reason: str | None,
               with_usage: bool) -> dict:
    chunk = {
        "id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(rid: str, created: int, model: str, obj: str, usage_: dict) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage_}


def model_list(model: str, created: int, max_model_len: int) -> dict:
    return {"object": "list", "data": [
        {"id": model, "object": "model", "created": created, "owned_by": "otel-llm", "root": model,
         "max_model_len": max_model_len},
    ]}
