"""Intervals on hand-built timelines equal the vLLM v1 definitions exactly."""

import numpy as np
import pytest

from otel_llm import FinishReason, RequestInfo
from otel_llm.frontend.request_table import FOLD_BATCH, SPANS_WITHIN_NS
from tests.otel_llm.conftest import Harness


@pytest.fixture
def h(h_any):
    """Every test here in both ways finished requests are folded (conftest.h_any)."""
    return h_any

S = 1_000_000_000  # ns per second
MS = 1_000_000


def only_value(h, name):
    """The single recorded value of a histogram (count 1) from its sum."""
    snap = h.hist(name)
    assert snap.counts.sum() == 1, f"{name}: {snap.counts.sum()} values"
    return snap.sums.sum()


def run_timeline(h, preempt_in_prefill=False, preempt_in_decode=False, timings=False):
    """arrival f=1s; QUEUED e=50.000s; SCHEDULED 50.010; first token 50.030; tokens each 5 ms; last 50.045."""
    h.fclock.t = 1 * S
    rid = h.tel.arrival(RequestInfo("r1", prompt_tokens=7, operation="chat", max_tokens=4, n=1))
    if timings:
        h.tel.want_timings(rid)
    h.at(50 * S).queued(rid)
    h.step(50 * S + 1 * MS, 1 * S + 2 * MS)
    h.at(50 * S + 10 * MS).scheduled(rid, 3)
    if preempt_in_prefill:
        h.at(50 * S + 15 * MS).preempted(rid)
        h.at(50 * S + 20 * MS).scheduled(rid, 0)  # reschedule: ignored for queue time
    h.at(50 * S + 30 * MS).outputs([rid], 1)
    h.step(50 * S + 30 * MS, 1 * S + 40 * MS, prompt_tokens=7)
    for k in (1, 2, 3):
        if preempt_in_decode and k == 2:
            h.at(50 * S + 36 * MS).preempted(rid)
            h.at(50 * S + 38 * MS).scheduled(rid, 0)
        h.at(50 * S + (30 + 5 * k) * MS).outputs([rid], 1)
        if k == 3:
            h.rec.finished(rid, FinishReason.LENGTH)
        h.step(50 * S + (30 + 5 * k) * MS, 1 * S + (40 + 5 * k) * MS)
    return rid


def test_intervals_match_vllm_definitions(h):
    run_timeline(h)
    assert only_value(h, "otel_llm.request.queue.duration") == 10 * MS * 1e-9  # first SCHEDULED - QUEUED
    assert only_value(h, "otel_llm.request.prefill.duration") == 20 * MS * 1e-9  # first token - SCHEDULED
    assert only_value(h, "otel_llm.request.decode.duration") == 15 * MS * 1e-9  # last - first token
    assert only_value(h, "otel_llm.request.inference.duration") == 35 * MS * 1e-9  # last - SCHEDULED
    assert only_value(h, "gen_ai.server.time_to_first_token") == 40 * MS * 1e-9  # frontend recv - arrival
    assert only_value(h, "gen_ai.server.request.duration") == 55 * MS * 1e-9  # frontend finish - arrival
    assert np.isclose(only_value(h, "gen_ai.server.time_per_output_token"), 15 * MS * 1e-9 / 3)
    itl = h.hist("otel_llm.request.inter_token_latency")
    assert itl.counts.sum() == 3 and np.isclose(itl.sums.sum(), 15 * MS * 1e-9)
    assert only_value(h, "otel_llm.request.generation_tokens") == 4
    assert only_value(h, "otel_llm.request.prompt_tokens") == 7
    assert only_value(h, "otel_llm.request.params.max_tokens") == 4
    assert only_value(h, "otel_llm.request.preemptions") == 0


def test_a_requests_timings_are_its_intervals(h):
    rid = run_timeline(h, preempt_in_decode=True, timings=True)
    assert h.tel.pop_timings(rid) == {
        "queue": 0.01, "prefill": 0.02, "ttft": 0.04, "decode": 0.015, "tpot": 0.005, "e2e": 0.055,
        "prompt_tokens": 7, "cached_prompt_tokens": 3, "completion_tokens": 4, "steps": 4, "preemptions": 1}
    assert h.tel.pop_timings(rid) is None  # handed out once
    assert h.tel.table.timed == {}


def test_timings_kept_for_a_bounded_number_of_requests(h, monkeypatch):
    monkeypatch.setattr("otel_llm.frontend.telemetry.MAX_TIMED", 2)
    for handle in (11, 12, 13):
        h.tel.want_timings(handle)
    assert list(h.tel.table.timed) == [12, 13]  # the oldest forgotten


def test_preemption_in_prefill_counts_toward_prefill(h):
    run_timeline(h, preempt_in_prefill=True)
    assert only_value(h, "otel_llm.request.queue.duration") == 10 * MS * 1e-9  # reschedule ignored
    assert only_value(h, "otel_llm.request.prefill.duration") == 20 * MS * 1e-9
    assert only_value(h, "otel_llm.request.preemptions") == 1


def test_preemption_in_decode_counts_toward_decode(h):
    run_timeline(h, preempt_in_decode=True)
    assert only_value(h, "otel_llm.request.decode.duration") == 15 * MS * 1e-9
    assert only_value(h, "otel_llm.request.inference.duration") == 35 * MS * 1e-9
    assert only_value(h, "otel_llm.request.preemptions") == 1


def test_counts_are_exact_for_many_requests(h):
    rng = np.random.default_rng(0)
    n_req, produced, prompt_total = 300, 0, 0
    live = {}
    t = 1 * S
    for i in range(n_req):
        prompt = int(rng.integers(1, 100))
        prompt_total += prompt
        rid = h.tel.arrival(RequestInfo(f"r{i}", prompt, "chat", max_tokens=64))
        h.at(t).queued(rid)
        h.at(t).scheduled(rid, 0)
        live[rid] = int(rng.integers(1, 20))
    while live:
        t += MS
        rids = list(live)
        h.at(t).outputs(rids, 1)
        produced += len(rids)
        for rid in rids:
            live[rid] -= 1
            if live[rid] == 0:
                h.rec.finished(rid, FinishReason.STOP if rid % 3 else FinishReason.LENGTH)
                del live[rid]
        h.step(t, t)
    success = h.counter("otel_llm.request.finished")
    assert success.sum() == n_req
    assert h.counter("otel_llm.usage.generation_tokens").sum() == produced
    assert h.counter("otel_llm.usage.prompt_tokens").sum() == prompt_total
    gen = h.hist("otel_llm.request.generation_tokens")
    assert gen.counts.sum() == n_req and gen.sums.sum() == produced
    assert h.tel.table.num_active == 0
    assert sum(h.dropped().values()) == 0


def test_multi_token_outputs_and_parallel_sampling(h):
    rid = h.tel.arrival(RequestInfo("r", 5, "text_completion", n=2))
    h.at(S).queued(rid)
    h.at(S).scheduled(rid)
    h.at(2 * S).outputs([rid], [2])  # two sequences, one token each
    h.step(2 * S, 2 * S)
    h.at(3 * S).outputs([rid], [3])
    h.rec.finished(rid, FinishReason.STOP, max_seq_tokens=3)
    h.step(3 * S, 3 * S)
    assert h.counter("otel_llm.usage.generation_tokens").sum() == 5
    assert only_value(h, "otel_llm.request.generation_tokens") == 5
    assert only_value(h, "otel_llm.request.max_generation_tokens") == 3
    assert only_value(h, "otel_llm.request.params.n") == 2


def test_abort_while_waiting_counts_but_records_no_engine_intervals(h):
    rid = h.tel.arrival(RequestInfo("r", 5, "chat"))
    h.at(S).queued(rid)
    h.rec.finished(rid, FinishReason.ABORT)
    h.step(S, 2 * S)
    reasons = h.counter("otel_llm.request.finished").reshape(-1, len(FinishReason)).sum(axis=0)
    assert reasons[FinishReason.ABORT] == 1
    assert h.hist("otel_llm.request.queue.duration").counts.sum() == 0
    assert h.hist("gen_ai.server.request.duration").counts.sum() == 1
    assert sum(h.dropped().values()) == 0


def test_slots_are_reused_and_table_grows(h):
    handles = [h.tel.arrival(RequestInfo(f"r{i}", 1)) for i in range(1000)]
    assert len(set(handles)) == 1000 and h.tel.table.cap == 1024
    for rid in handles:
        h.rec.finished(rid, FinishReason.ABORT)
    h.step(S, S)
    again = h.tel.arrival(RequestInfo("x", 1))
    assert again not in handles  # a reused slot gets a new generation
    h.rec.finished(handles[0], FinishReason.STOP)  # stale handle: dropped, counted
    h.step(S, S)
    assert h.dropped()["unknown_request"] == 1


def test_received_ns_ends_ttft_and_e2e_instead_of_the_ingest_time(h):
    """A frontend that stamps a step when its tokens went out and ingests it later passes
    the stamp: TTFT and e2e end there, not when ingest runs."""
    h.fclock.t = 1 * S
    rid = h.tel.arrival(RequestInfo("r1", prompt_tokens=3, operation="chat"))
    h.at(50 * S).queued(rid)
    h.at(50 * S).scheduled(rid)
    h.at(50 * S + 10 * MS).outputs([rid], 1)
    data = h.rec.end_step_bytes(3)
    h.fclock.t = 1 * S + 30 * MS  # ingest runs 30 ms after arrival...
    h.tel.ingest(data, received_ns=1 * S + 12 * MS)  # ...the step's output was handled at 12 ms
    h.at(50 * S + 15 * MS).outputs([rid], 1)
    h.rec.finished(rid, FinishReason.STOP)
    data = h.rec.end_step_bytes()
    h.fclock.t = 1 * S + 40 * MS
    h.tel.ingest(data, received_ns=1 * S + 17 * MS)
    assert only_value(h, "gen_ai.server.time_to_first_token") == 12 * MS * 1e-9
    assert only_value(h, "gen_ai.server.request.duration") == 17 * MS * 1e-9


def running(h, n: int) -> list[int]:
    """n requests queued, scheduled and past their first token."""
    rids = [h.tel.arrival(RequestInfo(f"r{i}", 3, "chat")) for i in range(n)]
    for rid in rids:
        h.at(S).queued(rid)
        h.at(S).scheduled(rid)
    h.at(2 * S).outputs(rids, 1)
    h.step(2 * S, 2 * S)
    return rids


def test_with_a_tracer_unsampled_finishes_wait_and_the_last_live_request_folds_them():
    """Unsampled finishes (under an unsampled traceparent, as with any sampler that says no) wait for
    a batch as without a tracer; a sampled one that leaves no request live folds everything kept at
    once, and only it has spans."""
    h = Harness()  # the SDK's default sampler: ParentBased(ALWAYS_ON)
    unsampled = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}
    rids = [h.tel.arrival(RequestInfo(f"u{i}", 3, "chat", trace_headers=unsampled)) for i in range(2)]
    rids.append(h.tel.arrival(RequestInfo("s", 3, "chat")))
    for rid in rids:
        h.at(S).queued(rid)
        h.at(S).scheduled(rid)
    h.at(2 * S).outputs(rids, 1)
    h.step(2 * S, 2 * S)
    for rid in rids[:2]:
        h.rec.finished(rid, FinishReason.STOP)
    h.step(3 * S, 3 * S)
    table = h.tel.table
    assert table.num_unfolded == 2 and h.exporter.get_finished_spans() == ()
    h.rec.finished(rids[2], FinishReason.LENGTH)
    h.step(4 * S, 4 * S)
    assert table.num_unfolded == 0
    roots = [s for s in h.exporter.get_finished_spans() if s.name == "chat m"]
    assert [s.attributes["gen_ai.request.id"] for s in roots] == ["s"]
    assert h.hist("gen_ai.server.request.duration").counts.sum() == 3


@pytest.mark.parametrize("steady", [True, False])
def test_a_sampled_finish_waits_for_the_batch_at_most_spans_within_ns(steady):
    """While other requests run, sampled finishes are kept (their trees built together later), until
    SPANS_WITHIN_NS after the first of them on the frontend's clock: the next step then folds them,
    a steady decode step as well as any other."""
    h = Harness()
    rids = running(h, 4)
    t = 3 * S
    for rid in rids[:2]:
        h.rec.finished(rid, FinishReason.STOP)
    h.at(t).outputs(rids[2:], 1)
    h.step(t, t)
    table = h.tel.table
    assert table.num_unfolded == 2 and h.exporter.get_finished_spans() == ()
    for k in range(1, 4):  # steps within the bound: still kept
        h.at(t + k * MS).outputs(rids[2:] if steady else rids[2:3], 1)
        h.step(t + k * MS, t + k * SPANS_WITHIN_NS // 4)
        assert table.num_unfolded == 2
    h.at(t + 4 * MS).outputs(rids[2:] if steady else rids[3:], 1)
    h.step(t + 4 * MS, t + SPANS_WITHIN_NS)
    assert table.num_unfolded == 0
    assert sorted(s.attributes["gen_ai.request.id"] for s in h.exporter.get_finished_spans()
                  if s.name == "chat m") == ["r0", "r1"]


def test_finishes_are_folded_in_batches_and_every_read_sees_them():
    h = Harness(tracer_provider=None, tracing=False)
    table = h.tel.table
    rids = running(h, FOLD_BATCH + 1)
    h.rec.finished(rids[0], FinishReason.STOP)
    h.step(3 * S, 3 * S)
    assert table.num_unfolded == 1 and table.num_active == FOLD_BATCH  # gone from the live requests at once
    h.at(4 * S).outputs([rids[0]], 1)  # a late event for it is dropped like any unknown handle
    h.step(4 * S, 4 * S)
    assert table.dropped["unknown_request"] == 1
    assert h.tel.model_statistics()["inference_count"] == 1  # Triton statistics fold first
    assert table.num_unfolded == 0
    for rid in rids[1:FOLD_BATCH]:
        h.rec.finished(rid, FinishReason.LENGTH)
    h.step(5 * S, 5 * S)
    assert table.num_unfolded == FOLD_BATCH - 1  # below the batch size: kept
    h.rec.finished(rids[FOLD_BATCH], FinishReason.LENGTH)
    h.step(6 * S, 6 * S)
    assert table.num_unfolded == 0  # the batch is full: folded without a read
    reasons = h.counter("otel_llm.request.finished").reshape(-1, len(FinishReason)).sum(axis=0)
    assert reasons[FinishReason.STOP] == 1 and reasons[FinishReason.LENGTH] == FOLD_BATCH
    e2e = h.hist("gen_ai.server.request.duration")
    assert e2e.counts.sum() == FOLD_BATCH + 1
    assert np.isclose(e2e.sums.sum(), 2 * S * 1e-9 + (FOLD_BATCH - 1) * 4 * S * 1e-9 + 5 * S * 1e-9)  # own finish times
    assert table.num_active == 0 and sum(h.dropped().values()) == 1


def test_first_tokens_are_folded_in_batches_and_every_read_sees_them():
    h = Harness(tracer_provider=None, tracing=False)
    running(h, 2)  # below the batch size: kept
    assert h.hist("gen_ai.server.time_to_first_token").counts.sum() == 2  # a read folds them
    assert h.counter("otel_llm.usage.prompt_tokens").sum() == 6
    assert h.tel.model_statistics()["response_stats"]["0"]["success"] == {"count": 2, "ns": 2 * S}  # SCHEDULED at 1 s
    running(h, FOLD_BATCH)  # a full batch: folded as it comes
    assert h.tel.table._firsts == []


def test_lifecycle_events_are_kept_until_a_fold_and_bounded(monkeypatch):
    from otel_llm.frontend import request_table

    monkeypatch.setattr(request_table, "_PENDING_EVENTS", 4)
    h = Harness(tracer_provider=None, tracing=False)
    table = h.tel.table
    rids = [h.tel.arrival(RequestInfo(f"r{i}", 3, "chat")) for i in range(3)]
    for rid in rids:
        h.at(S).queued(rid)
    h.step(S, S)
    assert table._num_events == 3 and table.queued[rids[0] & (table.cap - 1)] == 0  # kept
    h.at(S + 10 * MS).scheduled(rids[0])
    h.at(S + 10 * MS).scheduled(rids[0])  # twice in a step: the first counts
    h.step(S + 10 * MS, S + 10 * MS)
    assert table._num_events == 0  # the bound: applied without a read
    h.at(S + 20 * MS).outputs([rids[0]], 1)
    h.rec.finished(rids[0], FinishReason.STOP)
    h.step(S + 20 * MS, S + 20 * MS)
    assert only_value(h, "otel_llm.request.queue.duration") == 10 * MS * 1e-9
    assert only_value(h, "otel_llm.request.prefill.duration") == 10 * MS * 1e-9


def test_with_a_tracer_each_finish_is_folded_and_its_spans_emitted_at_once():
    h = Harness()
    rid = running(h, 1)[0]
    h.rec.finished(rid, FinishReason.STOP)
    h.step(3 * S, 3 * S)
    assert h.tel.table.num_unfolded == 0
    assert {s.name for s in h.exporter.get_finished_spans()} >= {"chat m", "queue", "prefill", "decode"}
