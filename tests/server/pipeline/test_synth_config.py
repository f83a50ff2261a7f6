"""`SynthConfig` validates at construction and names the bad value; the public surface is pinned."""

from __future__ import annotations

import pytest

import otel_llm.server.pipeline
from otel_llm.server.audio_spec import AUDIO_VOICES
from otel_llm.server.pipeline import SynthConfig


def test_defaults_are_openai_pcm16():
    c = SynthConfig()
    assert (c.voice, c.backend, c.sample_rate_hz) == ("alloy", "tone", 24000)
    assert c.chunk_bytes == 100 * 24 * 2


@pytest.mark.parametrize("voice", AUDIO_VOICES)
def test_every_openai_voice_is_accepted(voice):
    assert SynthConfig(voice=voice).voice == voice


@pytest.mark.parametrize("kwargs,named", [
    ({"voice": "bob"}, "'bob'"),
    ({"voice": "Alloy"}, "'Alloy'"),
    ({"backend": "festival"}, "'festival'"),
    ({"chunk_ms": 0}, "chunk_ms"),
    ({"chunk_ms": 5000}, "5000"),
    ({"chunk_ms": 20.5}, "20.5"),
    ({"char_ms": 10}, "char_ms"),
    ({"char_ms": True}, "True"),
    ({"sample_rate_hz": 16000}, "16000"),
])
def test_bad_values_raise_naming_them(kwargs, named):
    with pytest.raises(ValueError, match=next(iter(kwargs))) as exc:
        SynthConfig(**kwargs)
    assert named in str(exc.value)


def test_public_surface():
    assert otel_llm.server.pipeline.__all__ == ["EspeakSynth", "PcmStream", "Synth", "SynthConfig", "ToneSynth", "make_synth"]
