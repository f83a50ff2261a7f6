"""OpenAI's audio output on the wire: streamed `delta.audio` chunks and the final `message.audio`.

As OpenAI sends them (the openai client parses them into `ChoiceDeltaAudio` and
`ChatCompletionAudio`): with audio output the response text is the audio's `transcript`, not
`content`. A stream carries, per choice, audio deltas (the first with the audio `id`, each with
base64 PCM `data` and/or `transcript` text), then one update holding only `expires_at`, then
the usual chunk with `finish_reason`. Like `otel_llm.server.protocol`'s builders these return JSON-ready
dicts and cost about a dict literal (plus base64) per chunk.
"""

from __future__ import annotations

import base64
import uuid

from otel_llm.server import protocol

AUDIO_TTL_S = 3600  # `expires_at` = created + this; nothing is kept server-side for multi-turn use


def new_audio_id() -> str:
    return f"audio_{uuid.uuid4().hex}"


def expires_at(created: int) -> int:
    return created + AUDIO_TTL_S


def audio_delta(audio_id: str | None, pcm: bytes = b"", transcript: str = "") -> dict:
    """A streamed `delta`: `audio_id` on a choice's first audio delta only (None after), `pcm`
    (PCM16 bytes) as base64 `data`, `transcript` the text this piece of audio speaks."""
    audio: dict = {}
    if audio_id is not None:
        audio["id"] = audio_id
    if pcm:
        audio["data"] = base64.b64encode(pcm).decode("ascii")
    if transcript:
        audio["transcript"] = transcript
    return {"audio": audio}


def audio_chunk(rid: str, created: int, model: str, index: int, audio_id: str | None, pcm: bytes,
                transcript: str, with_usage: bool) -> dict:
    """A `chat.completion.chunk` carrying one audio delta (no finish_reason)."""
    return protocol.chat_chunk(rid, created, model, index, audio_delta(audio_id, pcm, transcript), None,
                               with_usage)


def audio_expiry_chunk(rid: str, created: int, model: str, index: int, with_usage: bool) -> dict:
    """A choice's final audio update: only `expires_at` (then comes the chunk with finish_reason)."""
    return protocol.chat_chunk(rid, created, model, index, {"audio": {"expires_at": expires_at(created)}}, None,
                               with_usage)


def message_audio(audio_id: str, pcm: bytes, transcript: str, created: int) -> dict:
    """`message.audio` of a non-streamed response: the whole PCM16 as base64."""
    return {"id": audio_id, "data": base64.b64encode(pcm).decode("ascii"), "expires_at": expires_at(created),
            "transcript": transcript}


def audio_chat_response(rid: str, created: int, model: str, audios: list[dict], reasons: list[str | None],
                        usage_: dict) -> dict:
    """A `chat.completion` with audio output: per choice `message.audio` (from `message_audio`),
    `content` null (the text is the transcript)."""
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": i, "message": {"role": "assistant", "content": None, "refusal": None, "audio": a},
                     "logprobs": None, "finish_reason": r} for i, (a, r) in enumerate(zip(audios, reasons))],
        "usage": usage_,
    }
