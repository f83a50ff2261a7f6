"""PipelineStatLogger: exact interval lines from a driven pipeline, deltas, idle, disabled, failures."""

from __future__ import annotations

import logging
import time

import pytest

from otel_llm.pipeline import PipelineConfig, PipelineTelemetry, TransferHop
from otel_llm.pipeline.log import PipelineStatLogger

MS = 1_000_000
SECOND = 1000 * MS


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def setup(**config):
    """A pipeline on a ns clock and its logger on a seconds clock, no thread."""
    clock, wall = Clock(10 * SECOND), Clock(100.0)
    p = PipelineTelemetry(PipelineConfig("tts", sample_rate=8000, **config), clock=clock)
    return p, clock, wall, PipelineStatLogger(p, 10.0, start_thread=False, clock=wall)


def hop(fs, fr, ts, tr, t0, size, tx_ms=2, in_flight_ms=3, rx_ms=1):
    tx_end = t0 + tx_ms * MS
    rx_start = tx_end + in_flight_ms * MS
    return TransferHop(fs, fr, ts, tr, size, t0, tx_end, rx_start, rx_start + rx_ms * MS)


def audio_request(p, clock, rid, gaps_ms, start_ms=100):
    """An audio response on stage 1 replica 0: 2000-byte chunks (0.125 s of audio each) after
    the gaps; finished 10 ms after the last one with 0.4 s of generation (RTF 0.8 for 4 chunks)."""
    r = p.arrival(rid, audio=True)
    clock.t += start_ms * MS
    r.stage_started("1", "0")
    for gap in gaps_ms:
        clock.t += gap * MS
        r.audio_chunk("1", "0", 2000)
    clock.t += 10 * MS
    r.finish("stop", gen_time_s=0.4)
    return r


def messages(caplog, level=None):
    return [r.getMessage() for r in caplog.records
            if r.name == "otel_llm.stats" and (level is None or r.levelno == level)]


@pytest.fixture
def busy(caplog):
    """Interval 1: two audio responses on 1:0 (one stalls 375 ms), an empty one skipped on 1:1,
    an abort that never started, three hops on two edges; one request running, one waiting."""
    caplog.set_level(logging.DEBUG, "otel_llm.stats")
    p, clock, wall, log = setup(continuity_thresholds_ms=(100, 500))
    a = p.arrival("a")  # transfers of the first stage, not finished yet (observed as a batch of its hops)
    a.stage_started("0", "0")
    p.observe_transfers([hop("0", "0", "1", "0", clock.t, 3_000_000), hop("0", "0", "1", "0", clock.t, 1_000_000),
                         hop("0", "0", "1", "1", clock.t, 500_000)])
    audio_request(p, clock, "smooth", (125, 125, 125, 125))  # e2e 0.61 s, TTFP 0.225 s
    audio_request(p, clock, "stall", (0, 125, 500, 125))  # e2e 0.86 s, TTFP 0.1 s, underrun 0.375 s
    empty = p.arrival("empty", audio=True)
    empty.stage_started("1", "1")
    clock.t += 30 * MS
    empty.finish("stop")  # e2e 0.03 s
    p.arrival("gone").abort()  # a failure: no e2e (as vLLM-Omni)
    p.arrival("queued")
    wall.t += 10.0
    return p, clock, wall, log, a


def test_first_interval_lines(busy, caplog):
    p, clock, wall, log, _ = busy
    lines = log.log()
    assert lines == [
        "Pipeline tts: Finished: 4 reqs (abort: 1, stop: 3), Running: 1 reqs, Waiting: 1 reqs, "
        "Avg e2e latency: 500.0 ms",
        "Audio 1:0: Requests: 2, Avg TTFP: 162.5 ms, Audio: 1.00 s, Avg RTF: 0.800, Avg underrun: 187.5 ms, "
        "Worst underrun: <= 500 ms, Continuity ok: 50.0% @100ms, 100.0% @500ms",
        "Audio 1:1: Requests: 0, Skipped: 1 (no_audio_data: 1)",
        "Transfer 0:0 -> 1:0: Hops: 2, Bytes: 4000000, Avg size: 2000000 bytes, Avg tx: 2.00 ms, "
        "Avg in-flight: 3.00 ms, Avg rx: 1.00 ms, Throughput: 0.40 MB/s",
        "Transfer 0:0 -> 1:1: Hops: 1, Bytes: 500000, Avg size: 500000 bytes, Avg tx: 2.00 ms, "
        "Avg in-flight: 3.00 ms, Avg rx: 1.00 ms, Throughput: 0.05 MB/s",
    ]
    assert messages(caplog, logging.INFO) == lines


def test_second_interval_shows_only_the_deltas(busy, caplog):
    p, clock, wall, log, a = busy
    log.log()
    caplog.clear()
    a.transfer(hop("0", "0", "1", "0", clock.t, 1_000_000, tx_ms=4, in_flight_ms=1, rx_ms=2))
    clock.t += 1 * SECOND
    a.finish("length")  # arrived 2.5 s ago: 1.5 s of the fixture's requests, then 1 s
    audio_request(p, clock, "smooth2", (125, 125, 125, 125))
    wall.t += 5.0
    assert log.log() == [
        "Pipeline tts: Finished: 2 reqs (length: 1, stop: 1), Running: 0 reqs, Waiting: 1 reqs, "
        "Avg e2e latency: 1555.0 ms",  # (2.5 s + 0.61 s) / 2
        "Audio 1:0: Requests: 1, Avg TTFP: 225.0 ms, Audio: 0.50 s, Avg RTF: 0.800, Avg underrun: 0.0 ms, "
        "Worst underrun: 0 ms, Continuity ok: 100.0% @100ms, 100.0% @500ms",
        "Transfer 0:0 -> 1:0: Hops: 1, Bytes: 1000000, Avg size: 1000000 bytes, Avg tx: 4.00 ms, "
        "Avg in-flight: 1.00 ms, Avg rx: 2.00 ms, Throughput: 0.20 MB/s",
    ]
    assert len(messages(caplog, logging.INFO)) == 3


def test_idle_intervals_drop_to_debug(busy, caplog):
    p, clock, wall, log, _ = busy
    log.log()
    caplog.clear()
    idle_line = "Pipeline tts: Finished: 0 reqs, Running: 1 reqs, Waiting: 1 reqs"
    assert log.log() == [idle_line]  # idle, but the previous interval was busy: still INFO
    assert messages(caplog, logging.INFO) == [idle_line]
    caplog.clear()
    assert log.log() == [idle_line]  # idle twice: DEBUG, an idle server is silent at INFO
    assert messages(caplog, logging.DEBUG) == [idle_line] and not messages(caplog, logging.INFO)
    p.arrival("new").abort()  # one finish wakes it up (a failure: no e2e)
    assert log.log() == ["Pipeline tts: Finished: 1 reqs (abort: 1), Running: 1 reqs, Waiting: 1 reqs"]
    assert caplog.records[-1].levelno == logging.INFO


def test_a_fresh_pipeline_is_silent(caplog):
    caplog.set_level(logging.DEBUG, "otel_llm.stats")
    _, _, _, log = setup()
    assert log.log() == ["Pipeline tts: Finished: 0 reqs, Running: 0 reqs, Waiting: 0 reqs"]
    assert not messages(caplog, logging.INFO)


def test_first_packet_alone_is_activity(caplog):
    caplog.set_level(logging.DEBUG, "otel_llm.stats")
    p, clock, _, log = setup()
    r = p.arrival("long", audio=True)
    r.stage_started("1", "0")
    clock.t += 300 * MS
    r.audio_chunk("1", "0", 2000)
    assert log.log()[1] == "Audio 1:0: Requests: 0, Avg TTFP: 300.0 ms"
    assert caplog.records[-1].levelno == logging.INFO


def test_overflow_series_last(caplog):
    caplog.set_level(logging.DEBUG, "otel_llm.stats")
    p, clock, wall, log = setup(cardinality_limit=1)
    for reason in ("stop", "length"):
        r = p.arrival(reason)
        r.transfer(hop("0", "0", "1", reason, clock.t, 100_000))
        r.finish(reason)
    wall.t += 1.0
    tail = "Avg tx: 2.00 ms, Avg in-flight: 3.00 ms, Avg rx: 1.00 ms, Throughput: 0.10 MB/s"
    assert log.log() == [
        "Pipeline tts: Finished: 2 reqs ((overflow): 1, stop: 1), Running: 0 reqs, Waiting: 0 reqs, "
        "Avg e2e latency: 0.0 ms",
        f"Transfer 0:0 -> 1:stop: Hops: 1, Bytes: 100000, Avg size: 100000 bytes, {tail}",
        f"Transfer (overflow): Hops: 1, Bytes: 100000, Avg size: 100000 bytes, {tail}",
    ]


def test_disabled_pipeline_logs_nothing(caplog):
    caplog.set_level(logging.DEBUG, "otel_llm.stats")
    p = PipelineTelemetry(PipelineConfig("tts", enabled=False))
    log = PipelineStatLogger(p, 0.01)
    assert log._thread is None
    p.arrival("r").finish("stop")
    assert log.log() == [] and not caplog.records


def test_failure_is_logged_and_counted_never_raised(caplog):
    caplog.set_level(logging.DEBUG, "otel_llm.stats")
    p, _, _, log = setup()

    def broken(family):
        raise RuntimeError("boom")

    p.family = broken
    assert log.log() == [] and log.failed == 1
    assert caplog.records[-1].levelno == logging.ERROR and caplog.records[-1].exc_info


def test_thread_logs_every_interval(caplog):
    caplog.set_level(logging.DEBUG, "otel_llm.stats")
    p, _, _, _ = setup()
    log = PipelineStatLogger(p, 0.01)
    try:
        deadline = time.monotonic() + 10.0
        while len(messages(caplog)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(messages(caplog)) >= 2 and log._thread.is_alive()
    finally:
        log.stop()
    log._thread.join(1.0)
    assert not log._thread.is_alive()


@pytest.mark.parametrize("bad", [0, -1.0, True, "10"])
def test_bad_interval_raises(bad):
    p, _, _, _ = setup()
    with pytest.raises(ValueError, match="interval_s"):
        PipelineStatLogger(p, bad, start_thread=False)
