"""The engine's StepRecorder stream accounts exactly for what the engine did."""

from __future__ import annotations

from collections import Counter

from engine_helpers import run_to_completion

from otel_llm.engine.step import EventKind, FinishReason, StepRecord
from otel_llm.server.engine import SamplingParams


def test_step_records_account_exactly(dummy, make_engine):
    engine = make_engine(block_size=4, snapshot_interval_s=3600.0)
    tok = dummy.tokenizer
    shared = tok.encode("shared prefix of sixteen..")
    engine.add_request(0, shared + [1, 2], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    engine.add_request(1, shared + [3], SamplingParams(temperature=1.0, seed=1, n=2, max_tokens=5, ignore_eos=True))
    engine.add_request(2, tok.encode("to be aborted"), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request(3, tok.encode("short"), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    telemetry = [engine.step().telemetry]
    engine.abort(2)
    tokens, _, reasons, rest = run_to_completion(engine)
    records = [StepRecord.from_bytes(t) for t in telemetry + rest]
    # tokens: every generated token is counted once, per request
    counted = Counter()
    for rec in records:
        for rid, n in zip(rec.output_rid.tolist(), rec.output_num_tokens.tolist()):
            counted[rid] += n
    assert counted[1] == 10  # two sequences of 5
    assert counted[0] == 6 and counted[3] == 1
    assert 0 < counted[2] <= 2
    # lifecycle events
    events = [(int(r), EventKind(k)) for rec in records for r, k in zip(rec.event_rid, rec.event_kind)]
    assert Counter(r for r, k in events if k == EventKind.QUEUED) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert Counter(r for r, k in events if k == EventKind.SCHEDULED) == {0: 1, 1: 1, 2: 1, 3: 1}
    # finishes: one per request, with its reason and, for n > 1, the longest sequence
    finished = {int(r): (FinishReason(x), int(m)) for rec in records
                for r, x, m in zip(rec.finished_rid, rec.finished_reason, rec.finished_max_seq_tokens)}
    assert sum(len(rec.finished_rid) for rec in records) == 4
    assert finished == {0: (FinishReason.LENGTH, 0), 1: (FinishReason.LENGTH, 5),
                        2: (FinishReason.ABORT, 0), 3: (FinishReason.LENGTH, 0)}
    # the prefix-cache hit of request 1 is on its SCHEDULED event and in the snapshot deltas
    sched_value = {int(r): int(v) for rec in records
                   for r, k, v in zip(rec.event_rid, rec.event_kind, rec.event_value) if k == EventKind.SCHEDULED}
    assert sched_value[1] == len(shared) // 4 * 4 and sched_value[0] == 0
    # request 3 (max_tokens=1) finished within the first step
    snaps = [rec.snapshot for rec in records if rec.snapshot is not None]
    assert snaps[0].running == 3 and snaps[0].waiting == 0 and 0 < snaps[0].kv_usage <= 1
    assert snaps[-1].running == 0 and snaps[-1].waiting == 0  # idle is visible
    assert sum(s.prefix_hits for s in snaps) == sched_value[1]
    assert sum(s.prefix_queries for s in snaps) == len(shared) * 2 + 3 + len(tok.encode("to be aborted")) + len(
        tok.encode("short"))
    assert len(snaps) == 2  # first step, then running dropped to 0; the interval is an hour
    # prompt tokens computed: every prompt once, minus the cached part
    prompt_total = (len(shared) + 2) + (len(shared) + 1) + len(tok.encode("to be aborted")) + len(tok.encode("short"))
    assert sum(rec.num_computed_prompt_tokens for rec in records) == prompt_total - sched_value[1]


def test_token_counts_match_outputs_under_preemption(dummy, make_engine):
    engine = make_engine(num_kv_blocks=20, block_size=4, max_model_len=48)
    for rid in range(5):
        engine.add_request(rid, dummy.tokenizer.encode(f"p{rid} " * 2), SamplingParams(
            temperature=0.8, seed=rid, max_tokens=25, ignore_eos=True, n=1 + rid % 2))
    tokens, _, _, telemetry = run_to_completion(engine)
    records = [StepRecord.from_bytes(t) for t in telemetry]
    assert engine.scheduler.num_preemptions > 0
    assert sum(int(rec.output_num_tokens.sum()) for rec in records) == sum(len(t) for t in tokens.values())
    kinds = Counter(EventKind(k) for rec in records for k in rec.event_kind)
    assert kinds[EventKind.PREEMPTED] == engine.scheduler.num_preemptions
    assert kinds[EventKind.SCHEDULED] == 5 + kinds[EventKind.PREEMPTED]
    # re-admissions carry no cached-token count
    values = [int(v) for rec in records for k, v in zip(rec.event_kind, rec.event_value) if k == EventKind.SCHEDULED]
    assert values.count(0) >= kinds[EventKind.PREEMPTED]


def test_log_stats_off_returns_no_telemetry(make_engine):
    engine = make_engine(log_stats=False)
    engine.add_request(0, [1, 2, 3], SamplingParams(max_tokens=2))
    while engine.has_unfinished():
        assert engine.step().telemetry is None


def test_request_that_can_never_fit_finishes_with_error(make_engine):
    engine = make_engine(num_kv_blocks=8, block_size=4, max_model_len=32)
    engine.add_request(0, [1, 2, 3, 4, 5], SamplingParams(temperature=1.0, seed=0, n=4, max_tokens=20, ignore_eos=True))
    tokens, _, reasons, telemetry = run_to_completion(engine)
    assert set(reasons.values()) == {FinishReason.ERROR}
    records = [StepRecord.from_bytes(t) for t in telemetry]
    assert [FinishReason(r) for rec in records for r in rec.finished_reason] == [FinishReason.ERROR]
    assert sum(int(rec.output_num_tokens.sum()) for rec in records) == sum(len(t) for t in tokens.values())
    assert engine.block_manager.num_free_blocks == 8


def test_steady_decode_steps_take_the_telemetry_fast_path(dummy, make_engine):
    """A decode step of an unchanged batch is an outputs-only record whose rids repeat the
    previous step's, which `Telemetry.ingest` applies without decoding (apply_steady)."""
    from otel_llm.engine.step import outputs_only_header

    engine = make_engine(snapshot_interval_s=3600.0)
    for rid in range(1, 5):
        engine.add_request(rid, dummy.tokenizer.encode(f"prompt {rid}"), SamplingParams(max_tokens=12, ignore_eos=True))
    steps = [engine.step().telemetry for _ in range(8)]
    steady = [t for t in steps[2:] if outputs_only_header(t) is not None]
    assert len(steady) == 6  # every decode step after the first token and the first snapshot
    body = [t[-4 * 8:] for t in steady]
    assert len(set(body)) == 1  # same four rids, same order


def test_kv_cache_metrics_sample_every_block_and_report_evictions(dummy, make_engine):
    """With a sample rate of 1 every block handed out again is one eviction in the step records."""
    from otel_llm.engine.kv_residency import KVResidencySampler

    engine = make_engine(block_size=4, num_kv_blocks=16, max_model_len=64, kv_cache_metrics_sample=1.0)
    tok = dummy.tokenizer
    retaken = []
    take = engine.block_manager._take_free_block

    def counting_take():  # blocks already handed out once, handed out again: vLLM's evictions
        block = take()
        retaken.append(block)
        return block

    engine.block_manager._take_free_block = counting_take
    for rid in range(6):
        engine.add_request(rid, tok.encode(f"prompt number {rid} is long enough"),
                           SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    _, _, _, records = run_to_completion(engine)
    evictions = [StepRecord.from_bytes(t).kv_evictions for t in records]
    lifetimes = [x for ev in evictions if ev is not None for x in ev.lifetime_ns.tolist()]
    seen, again = set(), 0
    for block in retaken:
        again += block in seen
        seen.add(block)
    assert again > 0 and len(lifetimes) == again
    assert all(x >= 0 for x in lifetimes)
    assert isinstance(engine.residency, KVResidencySampler)
    assert make_engine(kv_cache_metrics_sample=0.0).residency is None
    assert make_engine(kv_cache_metrics_sample=1.0, log_stats=False).residency is None
