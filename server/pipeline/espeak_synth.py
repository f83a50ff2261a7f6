"""`EspeakSynth`: speech from Debian's `espeak-ng` program, where it is installed.

Chosen explicitly (`SynthConfig(backend="espeak")`). Each phrase (text up to `,` `.` `;` `:`
`!` `?` or a newline) is spoken by one `espeak-ng --stdout` run; its WAV output is converted to
OpenAI's pcm16 (mono, 16-bit, 24 kHz, linear resampling) with numpy. The voice sets espeak's pitch.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess

import numpy as np

from otel_llm.server.audio_spec import AUDIO_VOICES
from otel_llm.server.pipeline.pcm_stream import PcmStream
from otel_llm.server.pipeline.synth_config import SynthConfig

_PHRASE_END = re.compile(r"[.,;:!?\n]")
_WORDS_PER_MINUTE = 170
_TIMEOUT_S = 30.0


class EspeakSynth:
    """Text -> PCM16 through `espeak-ng`. Raises ValueError at construction if it is not installed.
    Thread-safe (each call runs its own process)."""

    def __init__(self, config: SynthConfig):
        path = shutil.which("espeak-ng")
        if path is None:
            raise ValueError(f"backend={config.backend!r} needs the espeak-ng program, which is not on PATH "
                             "(Debian: apt-get install espeak-ng); the default backend 'tone' needs nothing")
        self.config = config
        self._argv = [path, "--stdout", "--stdin", "-v", "en", "-s", str(_WORDS_PER_MINUTE),
                      "-p", str(20 + 5 * AUDIO_VOICES.index(config.voice))]  # pitch 0-99, 50 is espeak's own

    def synthesise(self, text: str) -> bytes:
        """The PCM of the whole `text` (b"" for text with nothing to say)."""
        if not text.strip():
            return b""
        wav = subprocess.run(self._argv, input=text.encode(), capture_output=True, check=True,
                             timeout=_TIMEOUT_S).stdout
        return wav_to_pcm16(wav, self.config.sample_rate_hz)

    def stream(self) -> PcmStream:
        """Incremental synthesis, a phrase at a time (espeak needs the phrase for its intonation)."""
        return PcmStream(self.synthesise, _phrases_end, self.config.chunk_bytes)


def _phrases_end(text: str) -> int:
    """How many leading characters of `text` are whole phrases."""
    ends = [m.end() for m in _PHRASE_END.finditer(text)]
    return ends[-1] if ends else 0


def wav_to_pcm16(wav: bytes, rate_hz: int) -> bytes:
    """A 16-bit PCM WAV file -> mono little-endian int16 at `rate_hz`. A data chunk whose size field
    overstates it (espeak writing to a pipe cannot seek back to fix it) is read to the end."""
    if wav[:4] != b"RIFF" or wav[8:12] != b"WAVE":
        raise ValueError(f"not a WAV file: starts with {wav[:12]!r}")
    pos, fmt, data = 12, None, None
    while pos + 8 <= len(wav):
        chunk_id, size = wav[pos:pos + 4], int.from_bytes(wav[pos + 4:pos + 8], "little")
        if chunk_id == b"fmt ":
            fmt = struct.unpack("<HHIIHH", wav[pos + 8:pos + 24])
        elif chunk_id == b"data":
            data = wav[pos + 8:pos + 8 + size]
            break
        pos += 8 + size + (size & 1)
    if fmt is None or data is None:
        raise ValueError("WAV file without a fmt or data chunk")
    encoding, channels, rate, _, _, bits = fmt
    if encoding != 1 or bits != 16:
        raise ValueError(f"WAV encoding {encoding} with {bits} bits per sample; need 1 (PCM) with 16")
    frame = 2 * channels
    samples = np.frombuffer(data[:len(data) // frame * frame], dtype="<i2").reshape(-1, channels)
    mono = samples.mean(axis=1)
    if rate != rate_hz and len(mono):
        n_out = round(len(mono) * rate_hz / rate)
        mono = np.interp(np.arange(n_out) * (rate / rate_hz), np.arange(len(mono)), mono)
    return np.round(mono).clip(-32768, 32767).astype("<i2").tobytes()
