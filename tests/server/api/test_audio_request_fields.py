"""`modalities` and `audio` of a chat request, as OpenAI defines them: parsed, then checked by
`output_modalities` / `audio_output`, each bad value an `InvalidField` naming the field."""

from __future__ import annotations

import pydantic
import pytest

from otel_llm.server import protocol
from otel_llm.server.protocol import AudioOutput, ChatCompletionRequest, InvalidField

MSG = [{"role": "user", "content": "hi"}]
AUDIO = {"voice": "alloy", "format": "pcm16"}


def _req(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=MSG, **fields)


@pytest.mark.parametrize("voice", protocol.AUDIO_VOICES)
def test_a_valid_audio_request_parses(voice):
    req = _req(modalities=["text", "audio"], audio={"voice": voice, "format": "pcm16", "extra": 1})
    assert protocol.output_modalities(req) == {"text", "audio"}
    assert protocol.audio_output(req) == AudioOutput(voice, "pcm16")


@pytest.mark.parametrize("fields", [{}, {"modalities": None}, {"modalities": ["text"]}])
def test_text_only_asks_for_no_audio(fields):
    req = _req(**fields)
    assert protocol.output_modalities(req) == {"text"}
    assert protocol.audio_output(req) is None
    assert protocol.unsupported_field(req) is None


def test_an_audio_object_without_audio_output_is_still_unsupported_as_before():
    req = _req(modalities=["text"], audio=AUDIO)
    assert protocol.audio_output(req) is None
    assert protocol.unsupported_field(req) == "audio"


@pytest.mark.parametrize("fields,param,contains", [
    ({"modalities": ["text", "video"]}, "modalities", "'video'"),
    ({"modalities": []}, "modalities", "empty"),
    ({"modalities": ["text", "audio"]}, "audio", '"format": "pcm16"'),
    ({"modalities": ["audio"], "audio": {"voice": "alloy", "format": "mp3"}}, "audio.format", "'mp3'"),
    ({"modalities": ["audio"], "audio": {"voice": "alloy", "format": "ogg"}}, "audio.format", "OpenAI's formats"),
    ({"modalities": ["audio"], "audio": {"voice": "bob", "format": "pcm16"}}, "audio.voice", "'bob'"),
    ({"modalities": ["audio"], "audio": {"voice": {"id": "voice_1234"}, "format": "pcm16"}}, "audio.voice",
     "voice_1234"),
])
def test_each_invalid_form_names_its_field(fields, param, contains):
    with pytest.raises(InvalidField) as exc:
        protocol.audio_output(_req(**fields))
    assert exc.value.param == param
    assert contains in str(exc.value)


def test_an_unsupported_format_names_the_supported_one():
    with pytest.raises(InvalidField, match="'pcm16' only"):
        protocol.audio_output(_req(modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}))


@pytest.mark.parametrize("audio", [{"voice": "alloy"}, {"format": "pcm16"}, {"voice": 3, "format": "pcm16"}, "alloy"])
def test_an_audio_object_of_the_wrong_shape_is_a_type_error(audio):
    with pytest.raises(pydantic.ValidationError):
        _req(modalities=["text", "audio"], audio=audio)
