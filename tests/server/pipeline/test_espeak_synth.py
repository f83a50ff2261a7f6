"""The espeak-ng backend: WAV conversion always; the program itself only where it is installed."""

from __future__ import annotations

import io
import shutil
import wave

import numpy as np
import pytest

from otel_llm.server.pipeline import EspeakSynth, SynthConfig, make_synth
from otel_llm.server.pipeline.espeak_synth import wav_to_pcm16

ESPEAK = shutil.which("espeak-ng")


def _wav(samples: np.ndarray, rate: int, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()


def test_24khz_mono_passes_through_unchanged():
    samples = (np.arange(2400) % 100 * 50).astype("<i2")
    assert wav_to_pcm16(_wav(samples, 24000), 24000) == samples.tobytes()


def test_22050hz_is_resampled_to_24khz_keeping_the_duration():
    t = np.arange(22050) / 22050
    out = np.frombuffer(wav_to_pcm16(_wav(np.round(8000 * np.sin(2 * np.pi * 440 * t)), 22050), 24000), "<i2")
    assert len(out) == 24000
    expected = 8000 * np.sin(2 * np.pi * 440 * np.arange(24000) / 24000)
    assert np.abs(out[:-2] - expected[:-2]).max() < 300  # linear interpolation of a 440 Hz tone


def test_stereo_is_mixed_to_mono():
    frames = np.array([[1000, 3000], [-2000, 0]]).reshape(-1)
    assert np.frombuffer(wav_to_pcm16(_wav(frames, 24000, channels=2), 24000), "<i2").tolist() == [2000, -1000]


def test_a_data_size_that_overstates_the_data_is_read_to_the_end():
    wav = bytearray(_wav(np.arange(10), 24000))
    wav[40:44] = (0x7FFFF000).to_bytes(4, "little")  # what a writer that cannot seek back leaves
    assert len(wav_to_pcm16(bytes(wav), 24000)) == 20


def test_not_a_wav_raises():
    with pytest.raises(ValueError, match="not a WAV"):
        wav_to_pcm16(b"hello", 24000)


def test_missing_program_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="'espeak'.*espeak-ng.*not on PATH"):
        make_synth(SynthConfig(backend="espeak"))


@pytest.mark.skipif(ESPEAK is None, reason="espeak-ng is not installed")
def test_espeak_speaks_24khz_pcm16_incrementally():
    synth = make_synth(SynthConfig(backend="espeak", voice="nova"))
    assert isinstance(synth, EspeakSynth)
    whole = synth.synthesise("Hello there.")
    assert len(whole) > 0.3 * 24000 * 2 and len(whole) % 2 == 0
    assert synth.synthesise("Hello there.") == whole
    stream = synth.stream()
    assert stream.feed("Hello") == []  # waits for the end of the phrase
    chunks = stream.feed(" there.") + stream.flush()
    assert b"".join(chunks) == whole
    assert all(len(c) <= synth.config.chunk_bytes for c in chunks)
