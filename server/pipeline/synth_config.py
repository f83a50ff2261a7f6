"""`SynthConfig`: what a talker's synthesiser is told, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

from otel_llm.server.audio_spec import AUDIO_VOICES, PCM16_SAMPLE_RATE_HZ

BACKENDS = ("tone", "espeak")


@dataclass(frozen=True)
class SynthConfig:
    """One synthesiser's settings.

    `voice`: one of OpenAI's voice names (each shifts the pitch). `backend`: "tone" (the built-in
    deterministic synthesiser, the default) or "espeak" (the `espeak-ng` program, which must be
    installed). `chunk_ms`: the most audio one streamed chunk holds. `char_ms`: the audio per
    character of text ("tone" only). `sample_rate_hz`: always 24000, OpenAI's pcm16 rate.
    Raises ValueError naming the bad value.
    """

    voice: str = "alloy"
    backend: str = "tone"
    chunk_ms: int = 100
    char_ms: int = 60
    sample_rate_hz: int = PCM16_SAMPLE_RATE_HZ

    def __post_init__(self) -> None:
        if self.voice not in AUDIO_VOICES:
            raise ValueError(f"voice must be one of {', '.join(AUDIO_VOICES)}, got {self.voice!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if type(self.chunk_ms) is not int or not 10 <= self.chunk_ms <= 1000:
            raise ValueError(f"chunk_ms must be an integer in [10, 1000], got {self.chunk_ms!r}")
        if type(self.char_ms) is not int or not 20 <= self.char_ms <= 500:
            raise ValueError(f"char_ms must be an integer in [20, 500], got {self.char_ms!r}")
        if self.sample_rate_hz != PCM16_SAMPLE_RATE_HZ:
            raise ValueError(f"sample_rate_hz must be {PCM16_SAMPLE_RATE_HZ} (OpenAI's pcm16 rate), "
                             f"got {self.sample_rate_hz!r}")

    @property
    def chunk_bytes(self) -> int:
        """The most PCM16 bytes in one streamed chunk (a whole number of samples)."""
        return self.chunk_ms * self.sample_rate_hz // 1000 * 2
