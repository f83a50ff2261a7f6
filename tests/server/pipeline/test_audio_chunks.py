"""The audio payloads parse with the real openai client's types and expose their fields."""

from __future__ import annotations

import base64

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from otel_llm.server import protocol
from otel_llm.server.pipeline import SynthConfig, ToneSynth
from otel_llm.server.pipeline import audio_chunks as ac

CREATED = 1_700_000_000


def test_streamed_audio_deltas_parse_as_choice_delta_audio():
    stream = ToneSynth(SynthConfig()).stream()
    audio_id = ac.new_audio_id()
    payloads = []
    for word in ["Hello ", "world."]:
        for j, pcm in enumerate(stream.feed(word)):
            first = not payloads
            payloads.append(ac.audio_chunk("chatcmpl-1", CREATED, "m", 0, audio_id if first else None, pcm,
                                           word if j == 0 else "", with_usage=False))
    payloads += [ac.audio_chunk("chatcmpl-1", CREATED, "m", 0, None, pcm, "", False) for pcm in stream.flush()]
    payloads.append(ac.audio_expiry_chunk("chatcmpl-1", CREATED, "m", 0, with_usage=False))
    payloads.append(protocol.chat_chunk("chatcmpl-1", CREATED, "m", 0, {}, "stop", False))

    chunks = [ChatCompletionChunk.model_validate(p) for p in payloads]
    audios = [c.choices[0].delta.audio for c in chunks[:-1]]
    assert audios[0].id == audio_id and all(a.id is None for a in audios[1:])
    pcm = b"".join(base64.b64decode(a.data) for a in audios if a.data)
    assert pcm == ToneSynth(SynthConfig()).synthesise("Hello world.")
    assert "".join(a.transcript or "" for a in audios) == "Hello world."
    final = audios[-1]
    assert (final.id, final.data, final.transcript) == (None, None, None)
    assert final.expires_at == CREATED + ac.AUDIO_TTL_S
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].delta.audio is None
    assert all(c.choices[0].delta.content is None for c in chunks)  # with audio, the text is the transcript


def test_an_audio_delta_holds_only_what_it_is_given():
    assert ac.audio_delta(None, b"", "") == {"audio": {}}
    assert ac.audio_delta("audio_1", b"\x01\x00", "hi") == {"audio": {"id": "audio_1", "data": "AQA=",
                                                                      "transcript": "hi"}}


def test_message_audio_parses_as_chat_completion_audio():
    pcm = ToneSynth(SynthConfig()).synthesise("Hi there")
    audio = ac.message_audio("audio_abc", pcm, "Hi there", CREATED)
    body = ac.audio_chat_response("chatcmpl-2", CREATED, "m", [audio], ["stop"], protocol.usage(5, 3))
    r = ChatCompletion.model_validate(body)
    message = r.choices[0].message
    assert message.content is None
    assert message.audio.id == "audio_abc"
    assert base64.b64decode(message.audio.data) == pcm
    assert message.audio.transcript == "Hi there"
    assert message.audio.expires_at == CREATED + ac.AUDIO_TTL_S
    assert r.choices[0].finish_reason == "stop" and r.usage.total_tokens == 8
