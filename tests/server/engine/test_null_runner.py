"""The "null" model: the whole engine around a runner that samples a fixed cycle without a forward pass."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from engine_helpers import run_to_completion

from otel_llm.engine.step import FinishReason, StepRecord
from otel_llm.server.engine import SamplingParams
from otel_llm.server.engine.null_runner import CYCLE, NullRunner
from otel_llm.server.model import load_model


@pytest.fixture(scope="module")
def null():
    return load_model("null")


def workload(engine, tokenizer) -> None:
    """Mixed lengths, n > 1 and a shared prefix: enough to chunk, fork and preempt a small cache."""
    for rid in range(6):
        prompt = tokenizer.encode(f"prompt number {rid} " * (1 + rid % 3))
        engine.add_request(rid, prompt, SamplingParams(max_tokens=10 + 7 * rid, ignore_eos=True, n=1 + rid % 2))


def test_the_engine_uses_the_null_runner(null, make_engine):
    assert isinstance(make_engine(null).runner, NullRunner)


def test_outputs_cycle_through_the_alphabet_and_honour_stops(null, make_engine):
    engine = make_engine(null)
    engine.add_request(0, [1, 2, 3], SamplingParams(max_tokens=30))
    engine.add_request(1, [4, 5], SamplingParams(max_tokens=30, stop=["ghi"]))
    engine.add_request(2, [6], SamplingParams(max_tokens=30, stop_token_ids=[CYCLE[4]]))
    tokens, texts, reasons, _ = run_to_completion(engine)
    assert texts[(0, 0)] == "abcdefghijklmnopqrstuvwxyzabcd" and reasons[(0, 0)] == FinishReason.LENGTH
    assert tokens[(0, 0)] == [CYCLE[i % len(CYCLE)] for i in range(30)]
    assert texts[(1, 0)] == "abcdef" and reasons[(1, 0)] == FinishReason.STOP
    assert texts[(2, 0)] == "abcd" and reasons[(2, 0)] == FinishReason.STOP


def test_schedules_step_for_step_like_the_dummy(dummy, null, make_engine):
    """Without prefix caching (whose hits depend on the generated tokens) scheduling depends on
    lengths only: with ignore_eos the null and dummy engines emit the same (rid, seq, finished)
    outputs in every step, preemptions included, and free every block."""
    runs = []
    for loaded in (dummy, null):
        engine = make_engine(loaded, num_kv_blocks=48, block_size=4, max_model_len=96,
                             max_num_batched_tokens=32, enable_prefix_caching=False)
        workload(engine, loaded.tokenizer)
        shape = []
        while engine.has_unfinished():
            shape.append([(o.rid, o.seq_index, o.finished) for o in engine.step().outputs])
        runs.append((shape, engine.scheduler.num_preemptions))
        bm = engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks and not any(bm.ref_counts)
    assert runs[0] == runs[1]
    assert runs[1][1] > 0


def test_telemetry_counts_every_token(null, make_engine):
    engine = make_engine(null)
    workload(engine, null.tokenizer)
    tokens, _, reasons, telemetry = run_to_completion(engine)
    records = [StepRecord.from_bytes(t) for t in telemetry]
    assert sum(int(rec.output_num_tokens.sum()) for rec in records) == sum(len(t) for t in tokens.values())
    assert sum(len(rec.finished_rid) for rec in records) == 6
    assert set(reasons.values()) == {FinishReason.LENGTH}


def test_a_paced_runner_starts_a_step_at_most_once_per_step_s():
    """`step_s` is a floor on the step period (a GPU's forward pass); the tokens are the same."""
    seqs = [SimpleNamespace(num_output_tokens=k) for k in range(3)]
    rows = [(k, None, None) for k in range(3)]
    runner, steps = NullRunner(0.02), 6
    start = time.monotonic()
    for _ in range(steps):
        assert runner.run(seqs, [1, 1, 1], [], rows) == list(CYCLE[:3])
    assert time.monotonic() - start >= 0.02 * (steps - 1)  # the first starts at once; a lower bound, never flaky
