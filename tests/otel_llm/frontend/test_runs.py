"""The deferred (run) token path equals a per-token reference model on random workloads.

Steady decode defers per-request updates (see RequestTable docstring); this drives
random schedules (joins, skipped steps, multi-token outputs, preemption, aborts,
finishes, statistics reads mid-run, run-timeline checkpoints) and checks every
token-path aggregate against a straightforward per-token Python model.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from otel_llm import FinishReason, RequestInfo
from otel_llm.frontend import request_table as rt
from tests.otel_llm.conftest import Harness


@pytest.fixture
def h(h_any):
    """Every test here in both ways finished requests are folded (conftest.h_any)."""
    return h_any


class Reference:
    """Per-token bookkeeping, the obvious way."""

    def __init__(self, cap: int):
        self.cap = cap  # response indices kept (Triton's response_stats); past it only counted
        self.itl: list[int] = []
        self.responses: dict[int, list[int]] = {}  # index -> [count, ns]
        self.batches: dict[int, list[int]] = {}  # batch size -> [count, ns]
        self.prev_step = 0
        self.req: dict[int, dict] = {}
        self.finished: list[dict] = []

    def output_step(self, ts: int, outs: dict[int, int]) -> None:
        b = self.batches.setdefault(len(outs), [0, 0])
        b[0] += 1
        b[1] += ts - self.prev_step if self.prev_step else 0
        self.prev_step = ts
        for h, n in outs.items():
            r = self.req[h]
            if r["first"] == 0:
                r["first"] = ts
                ns = ts - r["sched"]
            else:
                ns = ts - r["last"]
                self.itl.append(ns)
            if r["chunks"] < self.cap:
                resp = self.responses.setdefault(r["chunks"], [0, 0])
                resp[0] += 1
                resp[1] += ns
            r["chunks"] += 1
            r["gen"] += n
            r["last"] = ts


@pytest.mark.parametrize("seed,run_steps,most_running,cap", [
    (1, 4096, 12, rt.MAX_RESPONSE_INDEX), (2, 8, 12, rt.MAX_RESPONSE_INDEX), (3, 16, 12, rt.MAX_RESPONSE_INDEX),
    (4, 5, 12, rt.MAX_RESPONSE_INDEX),
    (5, 16, 48, rt.MAX_RESPONSE_INDEX), (6, 4096, 48, 20)])  # many requests per update; a small response cap
def test_run_path_matches_per_token_reference(monkeypatch, seed, run_steps, most_running, cap):
    monkeypatch.setattr(rt, "_RUN_STEPS", run_steps)  # force frequent run-timeline checkpoints
    monkeypatch.setattr(rt, "MAX_RESPONSE_INDEX", cap)
    rng = random.Random(seed)
    hs = Harness(tracing=False)
    ref = Reference(cap)
    t = 1_000_000_000
    waiting: list[int] = []
    running: list[int] = []
    for step in range(400):
        t += rng.randint(1_000_000, 60_000_000)
        rec = hs.at(t)
        for _ in range(rng.choice((0, 0, 0, 1, 2) if most_running <= 12 else (0, 2, 4, 6))):  # arrivals
            h = hs.tel.arrival(RequestInfo(f"r{step}", rng.randint(1, 50), "chat", max_tokens=64))
            rec.queued(h)
            ref.req[h] = {"sched": 0, "first": 0, "last": 0, "chunks": 0, "gen": 0}
            waiting.append(h)
        while waiting and len(running) < most_running and rng.random() < 0.7:  # admissions
            h = waiting.pop(0)
            rec.scheduled(h)
            ref.req[h]["sched"] = ref.req[h]["sched"] or t
            running.append(h)
        if running and rng.random() < 0.03:  # preemption: back to waiting, no output this step
            h = running.pop(rng.randrange(len(running)))
            rec.preempted(h)
            waiting.append(h)
        skip = rng.random() < 0.25  # some running requests produce nothing this step
        outs = {h: (2 if rng.random() < 0.05 else 1) for h in running if not (skip and rng.random() < 0.3)}
        if rng.random() < 0.8:  # the common case: a batch of single tokens, in a stable order
            outs = {h: 1 for h in outs}
        if outs:
            if all(n == 1 for n in outs.values()):
                rec.outputs(list(outs), 1)
            else:
                rec.outputs(list(outs), list(outs.values()))
            ref.output_step(t, outs)
        for h in list(running):
            r = ref.req[h]
            if h in outs and (r["gen"] >= 40 or rng.random() < 0.02):
                rec.finished(h, FinishReason.STOP)
                running.remove(h)
                ref.finished.append(r)
        if waiting and rng.random() < 0.02:  # abort while waiting (may never have produced a token)
            h = waiting.pop(rng.randrange(len(waiting)))
            rec.finished(h, FinishReason.ABORT)
            ref.finished.append(ref.req[h])
        hs.step(t, t + 1000)
        if rng.random() < 0.05:  # statistics read mid-run
            hs.tel.model_statistics()

    snap = hs.tel.snapshot()
    itl = snap.histograms["otel_llm.request.inter_token_latency"]
    expected = np.bincount(np.searchsorted(itl.bounds, np.array(ref.itl) * 1e-9, side="left"),
                           minlength=len(itl.bounds) + 1)
    assert itl.counts[0].tolist() == expected.tolist()
    assert itl.sums[0] == pytest.approx(sum(ref.itl) * 1e-9, rel=1e-9)
    if ref.itl:
        assert itl.mins[0] == pytest.approx(min(ref.itl) * 1e-9) and itl.maxs[0] == pytest.approx(max(ref.itl) * 1e-9)

    stats = hs.tel.model_statistics()
    got = {int(i): [v["compute_infer"]["count"], v["compute_infer"]["ns"]] for i, v in stats["response_stats"].items()}
    assert got == ref.responses
    assert {b["batch_size"]: [b["compute_infer"]["count"], b["compute_infer"]["ns"]]
            for b in stats["batch_stats"]} == ref.batches

    gen = snap.histograms["otel_llm.request.generation_tokens"]
    assert gen.sums.sum() == sum(r["gen"] for r in ref.finished)
    decode = snap.histograms["otel_llm.request.decode.duration"]
    with_tokens = [r for r in ref.finished if r["first"]]
    assert decode.sums.sum() == pytest.approx(sum(r["last"] - r["first"] for r in with_tokens) * 1e-9, rel=1e-9)
    assert snap.counters["otel_llm.usage.generation_tokens"].sum() == sum(r["gen"] for r in ref.req.values())
    assert hs.tel.table.n_run == int(hs.tel.table.in_run.sum())
    assert sum(hs.dropped().values()) == 0


def test_steady_steps_touch_no_request_state(h):
    """Once a batch is steady, a step only advances the run; per-request state catches up on finish."""
    hs = [h.tel.arrival(RequestInfo(f"r{i}", 8, "chat")) for i in range(4)]
    t = 1_000_000_000
    for x in hs:
        h.at(t).queued(x)
        h.rec.scheduled(x)
    for i in range(1, 6):
        h.at(t + i * 10_000_000).outputs(hs, 1)
        h.step(t + i * 10_000_000, t + i * 10_000_000)
    table = h.tel.table
    slots = [table.slot_of(x) for x in hs]
    assert table.n_run == 4 and table.chunks[slots].tolist() == [1, 1, 1, 1]  # deferred since step 1
    for x in hs:
        h.rec.finished(x, FinishReason.LENGTH)
    h.step(t + 60_000_000, t + 60_000_000)
    assert h.counter("otel_llm.usage.generation_tokens").sum() == 20
    assert h.hist("otel_llm.request.generation_tokens").sums.sum() == 20
    assert h.hist("otel_llm.request.decode.duration").sums.sum() == pytest.approx(4 * 0.04)
    assert table.n_run == 0
