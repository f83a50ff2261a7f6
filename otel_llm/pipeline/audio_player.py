"""A streaming-audio listener, simulated over one response's chunk arrivals (vLLM-Omni's audio SLOs).

Pure arithmetic over (arrival time, PCM bytes) chunks: no clock, no state, no numpy. The player
model is vLLM-Omni's (`vllm_omni/benchmarks/audio_continuity.compute_continuity_stats`, kept
identical so numbers compare): playback starts when the first non-empty chunk arrives, with no
start-up buffer, and consumes PCM at the real-time rate `sample_rate * sample_width * channels`
bytes/s from then on without pausing. When chunk i arrives, the player has wanted
`(t_i - t_0) * rate` bytes but received only the bytes of chunks 0..i-1; the worst such deficit,
in seconds of audio, is the request's underrun (> 0: the listener heard a gap). A request is
continuous at a threshold when its worst underrun is <= the threshold (vLLM-Omni's `<=`).

The other audio figures, as vLLM-Omni defines them: frames = PCM samples per channel
(bytes / (sample_width * channels)), duration = frames / sample_rate, TTFP = first non-empty
chunk - request arrival, RTF = generation time / duration. A response with no PCM at all is
skipped with reason `no_audio_data` (vLLM-Omni's silent-loss counter) and nothing else is
observed for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

NO_AUDIO_DATA = "no_audio_data"  # vLLM-Omni's skip reason: 200 OK with empty audio
DEFAULT_SAMPLE_RATE = 24000  # vLLM-Omni's fallback (most of its talker models)
DEFAULT_THRESHOLDS_MS = (100,)  # vLLM-Omni's AUDIO_CONTINUITY_DEFAULT_THRESHOLD_S = 0.1


class AudioChunk(NamedTuple):
    """One streamed audio chunk: when its last byte arrived (seconds, any clock shared with the
    request's arrival) and its PCM byte count."""

    arrival_s: float
    pcm_bytes: int


@dataclass(frozen=True)
class PlayerResult:
    """What the simulated listener experienced. With `skipped` set, only `skipped` is meaningful."""

    frames: int  # PCM samples per channel
    duration_s: float
    ttfp_s: float  # first non-empty chunk - request arrival
    rtf: float  # generation time / duration
    max_underrun_s: float  # worst player deficit, seconds of audio; 0.0 when it never ran dry
    underrun_events: int  # chunks that arrived after the player ran dry (one per gap)
    continuity: tuple[tuple[int, bool], ...]  # (threshold_ms, max_underrun_s <= threshold) per threshold
    skipped: str | None = None  # a skip reason (NO_AUDIO_DATA): the request produced no audio


def simulate(chunks: Iterable[AudioChunk | tuple[float, int]], sample_rate: int, *, request_arrival_s: float = 0.0,
             gen_time_s: float | None = None, sample_width: int = 2, channels: int = 1,
             thresholds_ms: Sequence[int] = DEFAULT_THRESHOLDS_MS) -> PlayerResult:
    """Simulate the listener over `chunks` (in arrival order; empty chunks are ignored).

    `gen_time_s`: the generating stage's time for RTF (vLLM-Omni: `stage_gen_time`); None uses
    last chunk - request arrival. Raises ValueError on invalid input (a non-positive sample rate,
    width or channel count, a negative byte count, a chunk arriving before the previous one or
    before the request): callers on a hot path catch it and count a drop.
    """
    if sample_rate <= 0 or sample_width <= 0 or channels <= 0:
        raise ValueError(f"PCM format must be positive: sample_rate={sample_rate!r}, "
                         f"sample_width={sample_width!r}, channels={channels!r}")
    bytes_per_s = sample_rate * sample_width * channels
    previous = request_arrival_s
    t0 = last = None  # the first and last non-empty chunk's arrival
    received = 0
    worst_bytes, events = 0.0, 0
    for arrival_s, pcm_bytes in chunks:  # one pass: the check and the player together
        if pcm_bytes < 0:
            raise ValueError(f"negative chunk size {pcm_bytes!r}")
        if arrival_s < previous:
            raise ValueError(f"chunk arrival {arrival_s!r} before {previous!r}")
        previous = arrival_s
        if pcm_bytes:
            if t0 is None:
                t0 = arrival_s
            deficit_bytes = (arrival_s - t0) * bytes_per_s - received  # as vLLM-Omni computes it
            if deficit_bytes > 0:
                worst_bytes = max(worst_bytes, deficit_bytes)
                events += 1
            received += pcm_bytes
            last = arrival_s
    frames = received // (sample_width * channels)
    if frames == 0:
        return PlayerResult(0, 0.0, 0.0, 0.0, 0.0, 0, (), NO_AUDIO_DATA)
    worst = worst_bytes / bytes_per_s
    duration_s = frames / sample_rate
    gen_s = last - request_arrival_s if gen_time_s is None else gen_time_s
    return PlayerResult(frames, duration_s, t0 - request_arrival_s, gen_s / duration_s if duration_s > 0 else 0.0,
                        worst, events, tuple((int(t), worst <= t / 1000) for t in thresholds_ms))
