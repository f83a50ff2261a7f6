"""The built-in synthesiser: deterministic, silent where there is nothing to say, the expected
length, and incremental output identical to one-shot output."""

from __future__ import annotations

import random

import numpy as np
import pytest

from otel_llm.server.pipeline import SynthConfig, ToneSynth, make_synth

TEXT = "Hello, world! The quick brown fox jumps over 13 lazy dogs. Ünïcödé too."


def _samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2")


def test_make_synth_defaults_to_the_tone_synth():
    assert isinstance(make_synth(SynthConfig()), ToneSynth)


def test_same_text_and_voice_give_the_same_bytes():
    a = ToneSynth(SynthConfig()).synthesise(TEXT)
    assert a == ToneSynth(SynthConfig()).synthesise(TEXT)
    assert a != ToneSynth(SynthConfig(voice="onyx")).synthesise(TEXT)  # the voice shifts the pitch
    assert _samples(a).any()


@pytest.mark.parametrize("char_ms", [20, 60, 75])
def test_length_is_one_character_duration_per_character_at_24khz(char_ms):
    pcm = ToneSynth(SynthConfig(char_ms=char_ms)).synthesise(TEXT)
    assert len(pcm) % 2 == 0
    assert len(_samples(pcm)) == len(TEXT) * char_ms / 1000 * 24000


def test_spaces_and_punctuation_are_silence_and_letters_are_not():
    synth = ToneSynth(SynthConfig(char_ms=40))
    per_char = 40 * 24
    samples = _samples(synth.synthesise("a b,c.!"))
    for i, char in enumerate("a b,c.!"):
        segment = samples[i * per_char:(i + 1) * per_char]
        assert segment.any() == char.isalnum(), char
    assert synth.synthesise("") == b""


def test_notes_fade_in_and_out_and_stay_below_full_scale():
    samples = _samples(ToneSynth(SynthConfig()).synthesise("xyz"))
    per_char = 60 * 24
    for i in range(3):
        segment = samples[i * per_char:(i + 1) * per_char]
        assert abs(int(segment[0])) < 200 and abs(int(segment[-1])) < 200  # no click at the boundaries
    assert np.abs(samples).max() < 0.4 * 32767


@pytest.mark.parametrize("seed", range(5))
def test_incremental_output_equals_one_shot(seed):
    synth = ToneSynth(SynthConfig(chunk_ms=50))
    rng = random.Random(seed)
    stream, chunks, pos = synth.stream(), [], 0
    while pos < len(TEXT):  # the text arrives in random pieces, as stage 0 streams it
        step = rng.randint(0, 7)
        chunks += stream.feed(TEXT[pos:pos + step])
        pos += step
    chunks += stream.flush()
    assert b"".join(chunks) == synth.synthesise(TEXT)


def test_chunks_are_bounded_and_all_but_the_last_full():
    config = SynthConfig(chunk_ms=50, char_ms=30)
    stream = ToneSynth(config).stream()
    chunks = []
    for word in TEXT.split(" "):
        chunks += stream.feed(word + " ")
    chunks += stream.flush()
    assert config.chunk_bytes == 50 * 24 * 2
    assert all(len(c) == config.chunk_bytes for c in chunks[:-1])
    assert 0 < len(chunks[-1]) <= config.chunk_bytes
    assert stream.flush() == []


def test_a_stream_emits_audio_before_the_text_ends():
    stream = ToneSynth(SynthConfig(chunk_ms=100, char_ms=60)).stream()
    assert stream.feed("a") == []  # 60 ms: less than a chunk, held
    assert [len(c) for c in stream.feed("b")] == [100 * 24 * 2]  # 120 ms: one chunk out, 20 ms held
    assert [len(c) for c in stream.flush()] == [20 * 24 * 2]
