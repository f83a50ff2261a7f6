"""End-to-end engine behaviour on the dummy model: greedy equivalence, batching, chunking, abort."""

from __future__ import annotations

import pytest
from engine_helpers import reference_greedy, run_to_completion

from otel_llm.engine.step import FinishReason
from otel_llm.server.engine import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def prompts(dummy, count: int) -> list[list[int]]:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    return [dummy.tokenizer.encode(" ".join(words[i % 8:] + words[:i % 8]) + f" #{i}") for i in range(count)]


def test_greedy_matches_reference_forward(dummy, make_engine):
    engine = make_engine()
    ps = prompts(dummy, 2)
    for rid, p in enumerate(ps):
        engine.add_request(rid, p, GREEDY)
    tokens, _, reasons, _ = run_to_completion(engine)
    for rid, p in enumerate(ps):
        assert tokens[(rid, 0)] == reference_greedy(dummy.config, dummy.weights, p, 12)
        assert reasons[(rid, 0)] == FinishReason.LENGTH


def test_greedy_same_alone_in_batch_and_chunked(dummy, make_engine):
    ps = prompts(dummy, 32)
    alone = []
    for p in ps[:3]:
        engine = make_engine()
        engine.add_request(7, p, GREEDY)
        alone.append(run_to_completion(engine)[0][(7, 0)])
    batched = make_engine(max_num_seqs=32)
    for rid, p in enumerate(ps):
        batched.add_request(rid, p, GREEDY)
    batch_tokens = run_to_completion(batched)[0]
    chunked = make_engine(max_num_batched_tokens=5)  # every prompt is split into chunks
    for rid, p in enumerate(ps):
        chunked.add_request(rid, p, GREEDY)
    chunk_tokens = run_to_completion(chunked)[0]
    uncached = make_engine(enable_prefix_caching=False, block_size=4)
    for rid, p in enumerate(ps):
        uncached.add_request(rid, p, GREEDY)
    uncached_tokens = run_to_completion(uncached)[0]
    for rid in range(3):
        assert batch_tokens[(rid, 0)] == alone[rid]
    assert batch_tokens == chunk_tokens == uncached_tokens


def test_chunked_prefill_respects_the_token_budget(dummy, make_engine):
    engine = make_engine(max_num_batched_tokens=7)
    schedule = engine.scheduler.schedule
    planned = []

    def checked_schedule():
        out = schedule()
        planned.append(sum(out.num_new_tokens))
        return out

    engine.scheduler.schedule = checked_schedule
    ps = prompts(dummy, 4)
    for rid, p in enumerate(ps):
        engine.add_request(rid, p, GREEDY)
    tokens = run_to_completion(engine)[0]
    assert max(planned) == 7
    assert sum(planned) == sum(len(p) for p in ps) + sum(len(t) - 1 for t in tokens.values())


def test_max_num_seqs_limits_running_requests(dummy, make_engine):
    engine = make_engine(max_num_seqs=3)
    for rid, p in enumerate(prompts(dummy, 8)):
        engine.add_request(rid, p, GREEDY)
    while engine.has_unfinished():
        engine.step()
        assert len(engine.scheduler.running) <= 3


def test_prefix_cache_hit_reported_as_cached_tokens(dummy, make_engine):
    engine = make_engine(block_size=4)
    prefix = dummy.tokenizer.encode("a shared system prompt, ")
    engine.add_request(0, prefix + [65, 66], GREEDY)
    run_to_completion(engine)
    engine.add_request(1, prefix + [67, 68, 69], GREEDY)
    cached = {out.num_cached_tokens for out in engine.step().outputs}
    assert cached == {len(prefix) // 4 * 4}


def test_abort_finishes_with_abort_and_frees_blocks(dummy, make_engine):
    engine = make_engine()
    ps = prompts(dummy, 3)
    for rid, p in enumerate(ps):
        engine.add_request(rid, p, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    engine.add_request(3, ps[0], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True, n=2))
    engine.step()
    engine.step()
    engine.abort(1)
    engine.abort(3)
    engine.abort(12345)  # unknown: ignored
    step = engine.step()
    aborted = [(o.rid, o.seq_index) for o in step.outputs if o.finish_reason == FinishReason.ABORT]
    assert sorted(aborted) == [(1, 0), (3, 0), (3, 1)]
    assert all(o.new_token_ids == [] for o in step.outputs if o.finish_reason == FinishReason.ABORT)
    assert not any(o.rid in (1, 3) and not o.finished for o in step.outputs)
    run_to_completion(engine)
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not any(bm.ref_counts)


def test_abort_waiting_request(dummy, make_engine):
    engine = make_engine(max_num_seqs=1)
    for rid, p in enumerate(prompts(dummy, 2)):
        engine.add_request(rid, p, GREEDY)
    engine.step()
    engine.abort(1)  # still waiting
    tokens, _, reasons, _ = run_to_completion(engine)
    assert reasons[(1, 0)] == FinishReason.ABORT and tokens.get((1, 0), []) == []
    assert reasons[(0, 0)] == FinishReason.LENGTH


def test_add_request_rejects_bad_prompts(dummy, make_engine):
    engine = make_engine(max_model_len=32)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request(0, [], GREEDY)
    with pytest.raises(ValueError, match="33 tokens.*max_model_len=32"):
        engine.add_request(0, [1] * 33, GREEDY)
    with pytest.raises(ValueError, match="n=65 is above max_num_seqs=64"):
        engine.add_request(0, [1], SamplingParams(n=65))
    engine.add_request(0, [1] * 32, GREEDY)
    with pytest.raises(ValueError, match="rid=0"):
        engine.add_request(0, [1], GREEDY)
    # a prompt of exactly max_model_len still gets one token, then LENGTH
    tokens, _, reasons, _ = run_to_completion(engine)
    assert len(tokens[(0, 0)]) == 1 and reasons[(0, 0)] == FinishReason.LENGTH


def test_max_model_len_ends_generation(dummy, make_engine):
    engine = make_engine(max_model_len=20)
    engine.add_request(0, [5] * 15, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    tokens, _, reasons, _ = run_to_completion(engine)
    assert len(tokens[(0, 0)]) == 5 and reasons[(0, 0)] == FinishReason.LENGTH


def test_generate_returns_text(dummy, make_engine):
    engine = make_engine()
    texts = engine.generate(["hello", "world"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    ids = reference_greedy(dummy.config, dummy.weights, dummy.tokenizer.encode("hello"), 8)
    assert texts[0] == dummy.tokenizer.decode(ids)
    assert len(texts) == 2 and not engine.has_unfinished()
