"""Scheduler snapshots at most 1 Hz per (stage, replica), each replica with its own throttle."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_llm import SchedulerSnapshot, StepRecorder, Telemetry, TelemetryConfig
from otel_llm.pipeline.throttle import SnapshotThrottle

MS = 1_000_000


class Clock:
    def __init__(self):
        self.t = 0

    def __call__(self) -> int:
        return self.t


def test_each_replica_emits_at_1_hz_when_stepping_at_the_same_times():
    clock = Clock()
    throttles = [SnapshotThrottle(clock=clock), SnapshotThrottle(clock=clock)]
    emitted = [[], []]
    for step in range(30):  # both replicas step every 100 ms for 3 s
        clock.t = step * 100 * MS
        for replica, throttle in enumerate(throttles):
            if throttle.due():
                emitted[replica].append(clock.t // MS)
    assert emitted == [[0, 1000, 2000], [0, 1000, 2000]]


def test_a_shared_throttle_starves_every_replica_but_the_first():
    """The bug the per-replica throttle fixes (vLLM-Omni removed its orchestrator-global one)."""
    clock = Clock()
    shared = SnapshotThrottle(clock=clock)
    emitted = [0, 0]
    for step in range(30):
        clock.t = step * 100 * MS
        for replica in (0, 1):
            emitted[replica] += shared.due()
    assert emitted == [3, 0]


def test_held_back_deltas_are_added_to_the_next_snapshot():
    clock = Clock()
    throttle = SnapshotThrottle(clock=clock)
    out = []
    for step in range(25):
        clock.t = step * 100 * MS
        snap = throttle.offer(SchedulerSnapshot(running=step, waiting=1, kv_usage=0.1, preemptions=1, prefix_queries=2))
        if snap is not None:
            out.append(snap)
    assert [s.running for s in out] == [0, 10, 20]  # gauges: the latest
    assert sum(s.preemptions for s in out) == 21  # counters: every step's, up to the last one let through
    assert sum(s.prefix_queries for s in out) == 42


def test_each_replica_gets_its_own_snapshot_stream_through_the_sdk():
    """Two replicas of one stage, each an engine loop with its own recorder and throttle,
    step at the same times; each replica's gauges and counters are its own."""
    clock = Clock()
    replicas = []
    for r in ("0", "1"):
        tel = Telemetry(TelemetryConfig("tts", log_stats=False, tracing=False, stage_replica=("0", r)), clock=clock)
        replicas.append((tel, StepRecorder(clock=clock), SnapshotThrottle(clock=clock)))
    attached = [0, 0]
    for step in range(25):
        clock.t = step * 100 * MS
        for i, (tel, rec, throttle) in enumerate(replicas):
            snap = throttle.offer(SchedulerSnapshot(running=10 * (i + 1) + step, waiting=i, kv_usage=0.0,
                                                    preemptions=i + 1))
            if snap is not None:
                rec.snapshot(snap)
                attached[i] += 1
            tel.ingest(rec.end_step_bytes())
    assert attached == [3, 3]
    values = {}
    for i, (tel, _, _) in enumerate(replicas):
        for fam in text_string_to_metric_families(tel.render().decode()):
            for s in fam.samples:
                if s.name in ("vllm:num_requests_running", "vllm:num_preemptions_total"):
                    assert s.labels["replica"] == str(i)
                    values[(s.name, i)] = s.value
    assert values[("vllm:num_requests_running", 0)] == 30 and values[("vllm:num_requests_running", 1)] == 40
    assert values[("vllm:num_preemptions_total", 0)] == 21 and values[("vllm:num_preemptions_total", 1)] == 42


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        SnapshotThrottle(0)
