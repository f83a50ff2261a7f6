"""`ToneSynth`: the built-in synthesiser, a short tone per character (no model, no download).

Each letter or digit becomes one `char_ms` note of a major pentatonic scale over two octaves
(the note from the character's code point, the octave's root from the voice), with a soft attack
and decay and a few harmonics; every other character (spaces, punctuation) is `char_ms` of
silence. Characters are independent, so the PCM of a text is the concatenation of its characters'
PCM: synthesis can start on any prefix of a text, and the output is the same bytes every time.
"""

from __future__ import annotations

import numpy as np

from otel_llm.server.audio_spec import AUDIO_VOICES
from otel_llm.server.pipeline.pcm_stream import PcmStream
from otel_llm.server.pipeline.synth_config import SynthConfig

_PENTATONIC_SEMITONES = (0, 2, 4, 7, 9, 12, 14, 16, 19, 21)
_HARMONICS = ((1, 0.6), (2, 0.25), (3, 0.1))  # (multiple of the note, amplitude)
_PEAK = 0.35 * 32767  # headroom: the harmonics add up to at most 0.95 of it
_FADE_MS = 5  # attack and release: no clicks between notes
_ROOT_HZ = 220.0  # the middle voice's root; the voices are a semitone apart around it


class ToneSynth:
    """Deterministic text -> PCM16 (little-endian, mono, 24 kHz). Thread-safe (read-only after init)."""

    def __init__(self, config: SynthConfig):
        self.config = config
        self._table = _note_table(config)  # row 0: silence; row 1 + i: note i of the scale

    def synthesise(self, text: str) -> bytes:
        """The PCM of the whole `text`: `len(text) * char_ms` ms of audio."""
        rows = np.fromiter((_row(c) for c in text), dtype=np.intp, count=len(text))
        return self._table[rows].tobytes()

    def stream(self) -> PcmStream:
        """Incremental synthesis: every character can be rendered as soon as it arrives."""
        return PcmStream(self.synthesise, len, self.config.chunk_bytes)


def _row(char: str) -> int:
    if not char.isalnum():
        return 0
    return 1 + ord(char) % len(_PENTATONIC_SEMITONES)


def _note_table(config: SynthConfig) -> np.ndarray:
    """int16 (little-endian) array of shape (1 + notes, samples per character)."""
    rate = config.sample_rate_hz
    n = config.char_ms * rate // 1000
    t = np.arange(n) / rate
    fade = _FADE_MS * rate // 1000
    envelope = np.exp(-t / (config.char_ms / 1000 / 2))  # a plucked note's decay
    ramp = 0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, fade))  # raised cosine
    envelope[:fade] *= ramp
    envelope[-fade:] *= ramp[::-1]
    root_hz = _ROOT_HZ * 2 ** ((AUDIO_VOICES.index(config.voice) - len(AUDIO_VOICES) // 2) / 12)
    table = np.zeros((1 + len(_PENTATONIC_SEMITONES), n), dtype="<i2")
    for i, semitones in enumerate(_PENTATONIC_SEMITONES):
        hz = root_hz * 2 ** (semitones / 12)
        wave = sum(a * np.sin(2 * np.pi * hz * k * t) for k, a in _HARMONICS)
        table[1 + i] = np.round(_PEAK * envelope * wave)
    return table
