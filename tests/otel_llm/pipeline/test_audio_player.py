"""The simulated listener on hand-built arrival timelines (times chosen exact in binary floating point)."""

import pytest

from otel_llm.pipeline.audio_player import NO_AUDIO_DATA, AudioChunk, simulate

RATE = 8000  # s16le mono: 16000 bytes per second of audio
CHUNK = 2000  # 0.125 s of audio


def chunks(*arrivals, size=CHUNK):
    return [AudioChunk(t, size) for t in arrivals]


def test_steady_stream_never_runs_dry():
    """Chunks of 0.125 s of audio every 0.125 s: the buffer never empties."""
    r = simulate(chunks(*(0.125 * i for i in range(8))), RATE, gen_time_s=0.5, thresholds_ms=(50, 100))
    assert r.skipped is None
    assert r.frames == 8000 and r.duration_s == 1.0
    assert r.max_underrun_s == 0.0 and r.underrun_events == 0
    assert r.continuity == ((50, True), (100, True))
    assert r.rtf == 0.5 and r.ttfp_s == 0.0


def test_one_stall_is_the_deficit_and_fails_lower_thresholds():
    """The third chunk comes 0.25 s late: the player wanted 0.5 s of audio and had 0.25 s; the
    deficit (0.25 s) carries on while later chunks keep pace."""
    r = simulate(chunks(0.0, 0.125, 0.5, 0.625, 0.75), RATE, thresholds_ms=(100, 250, 300))
    assert r.max_underrun_s == 0.25
    assert r.underrun_events == 3  # chunks 2, 3, 4 arrived with the player dry
    assert r.continuity == ((100, False), (250, True), (300, True))  # vLLM-Omni: ok when <= threshold


def test_late_start_is_ttfp_not_underrun():
    """The player starts with the first chunk (no start-up buffer): a late first chunk is TTFP."""
    r = simulate(chunks(2.0, 2.125, 2.25), RATE, request_arrival_s=0.5)
    assert r.ttfp_s == 1.5
    assert r.max_underrun_s == 0.0 and r.continuity == ((100, True),)
    assert r.rtf == (2.25 - 0.5) / 0.375  # default generation time: arrival to the last chunk


@pytest.mark.parametrize("timeline", [[], [AudioChunk(0.1, 0)], [AudioChunk(0.1, 1)]])
def test_empty_audio_is_skipped_with_reason(timeline):
    r = simulate(timeline, RATE)
    assert r.skipped == NO_AUDIO_DATA and r.frames == 0


def test_empty_chunks_are_ignored_and_channels_count():
    r = simulate([AudioChunk(0.0, 0), AudioChunk(0.25, 4 * CHUNK)], RATE, channels=2, request_arrival_s=0.0)
    assert r.ttfp_s == 0.25  # the first chunk with audio
    assert r.frames == 2000 and r.duration_s == 0.25


@pytest.mark.parametrize("kwargs", [{"sample_rate": 0}, {"sample_rate": RATE, "sample_width": 0},
                                    {"sample_rate": RATE, "chunks": chunks(0.5, 0.25)},
                                    {"sample_rate": RATE, "chunks": [AudioChunk(0.0, -1)]},
                                    {"sample_rate": RATE, "chunks": chunks(0.0), "request_arrival_s": 1.0}])
def test_invalid_input_raises_value_error(kwargs):
    kwargs.setdefault("chunks", chunks(0.0))
    with pytest.raises(ValueError):
        simulate(**kwargs)
