"""Scheduling under KV-cache pressure: preemption by recompute, FIFO order, same greedy text."""

from __future__ import annotations

import dataclasses

from engine_helpers import reference_greedy, run_to_completion

from otel_llm.engine.step import EventKind, FinishReason, StepRecord
from otel_llm.server.engine import SamplingParams
from otel_llm.server.engine.block_manager import BlockManager
from otel_llm.server.engine.request import Request
from otel_llm.server.engine.scheduler import Scheduler

PARAMS = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)


def _prompts(dummy):
    return [dummy.tokenizer.encode(f"request number {i} says {'hi ' * (i % 3)}") for i in range(6)]


def _events(telemetry):
    events = []
    for data in telemetry:
        rec = StepRecord.from_bytes(data)
        events += [(int(r), EventKind(k)) for r, k in zip(rec.event_rid, rec.event_kind)]
    return events


def test_preemption_under_block_pressure_keeps_results_and_order(dummy, make_engine):
    relaxed = make_engine()
    tight = make_engine(num_kv_blocks=16, block_size=4, max_model_len=64, snapshot_interval_s=0.0)
    for engine in (relaxed, tight):
        for rid, p in enumerate(_prompts(dummy)):
            engine.add_request(rid, p, PARAMS)
        engine.add_request(6, dummy.tokenizer.encode("two of us"), dataclasses.replace(PARAMS, n=2, max_tokens=12))
    want, want_text, _, _ = run_to_completion(relaxed)
    got, got_text, reasons, telemetry = run_to_completion(tight)
    assert got == want and got_text == want_text
    assert got[(6, 0)] == got[(6, 1)] == reference_greedy(dummy.config, dummy.weights, dummy.tokenizer.encode("two of us"), 12)
    assert set(reasons.values()) == {FinishReason.LENGTH}

    events = _events(telemetry)
    preempted = [rid for rid, kind in events if kind == EventKind.PREEMPTED]
    assert preempted, "the tight cache should have forced preemptions"
    assert tight.scheduler.num_preemptions == len(preempted)
    snapshots = [StepRecord.from_bytes(t).snapshot for t in telemetry]
    assert sum(s.preemptions for s in snapshots if s is not None) == len(preempted)
    # each preempted request is scheduled again later
    for i, (rid, kind) in enumerate(events):
        if kind == EventKind.PREEMPTED:
            assert (rid, EventKind.SCHEDULED) in events[i + 1:]
    # FIFO: first admissions in arrival order, and a preempted request (back at the front of
    # the queue) is rescheduled before any request that has not run yet
    first_scheduled = []
    for rid, kind in events:
        if kind == EventKind.SCHEDULED and rid not in first_scheduled:
            first_scheduled.append(rid)
    assert first_scheduled == list(range(7))
    seen = set()
    pending: set[int] = set()
    for rid, kind in events:
        if kind == EventKind.PREEMPTED:
            pending.add(rid)
        elif kind == EventKind.SCHEDULED:
            if rid not in seen:
                assert not pending, f"request {rid} admitted ahead of preempted {pending}"
                seen.add(rid)
            pending.discard(rid)
    bm = tight.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_newest_running_request_is_preempted_first():
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    reqs = [Request(rid, [1, 2, 3, 4, 5, 6, 7], PARAMS) for rid in range(2)]
    for r in reqs:
        sched.add(r)
    out = sched.schedule()
    assert [r.rid for r in out.scheduled] == [0, 1] and bm.num_free_blocks == 0
    for seq, n in zip(out.seqs, out.num_new_tokens):
        seq.num_computed_tokens += n
        seq.token_ids.append(9)  # position 7: still in block 1
    out = sched.schedule()
    assert not out.preempted and out.num_new_tokens == [1, 1]
    for seq in out.seqs:
        seq.num_computed_tokens += 1
        seq.token_ids.append(9)  # position 8 needs a third block each: none are free
    out = sched.schedule()
    assert [r.rid for r in out.preempted] == [1]
    assert [s.request.rid for s in out.seqs] == [0] and out.scheduled == []
    assert list(sched.waiting) == [reqs[1]] and sched.running == [reqs[0]]
    assert reqs[1].seqs[0].num_computed_tokens == 0 and reqs[1].seqs[0].block_table == []


def test_waiting_requests_admitted_in_fifo_order_within_budget():
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=10)
    for rid in range(3):
        sched.add(Request(rid, list(range(10 * rid, 10 * rid + 6)), PARAMS))
    out = sched.schedule()
    # request 0 whole (6 tokens), request 1 a 4-token chunk; request 2 over max_num_seqs
    assert [(s.request.rid, n) for s, n in zip(out.seqs, out.num_new_tokens)] == [(0, 6), (1, 4)]
    assert out.num_prompt_tokens == 10
    assert [r.rid for r in sched.waiting] == [2]
