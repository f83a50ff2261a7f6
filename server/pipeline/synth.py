"""`Synth`: what a talker needs from a synthesiser, and `make_synth` to build the configured one."""

from __future__ import annotations

from typing import Protocol

from otel_llm.server.pipeline.espeak_synth import EspeakSynth
from otel_llm.server.pipeline.pcm_stream import PcmStream
from otel_llm.server.pipeline.synth_config import SynthConfig
from otel_llm.server.pipeline.tone_synth import ToneSynth


class Synth(Protocol):
    """Text -> PCM16 little-endian mono at `config.sample_rate_hz` (24 kHz)."""

    config: SynthConfig

    def synthesise(self, text: str) -> bytes:
        """The PCM of a whole text, at once."""

    def stream(self) -> PcmStream:
        """A new incremental synthesis (one per response)."""


def make_synth(config: SynthConfig) -> Synth:
    """The synthesiser `config.backend` names; raises ValueError if "espeak" is not installed."""
    if config.backend == "espeak":
        return EspeakSynth(config)
    return ToneSynth(config)
