"""Sampling parameters and the sampler: greedy, top-k/top-p, seeds, stops, limits, n > 1."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_helpers import reference_greedy, run_to_completion

from otel_llm.engine.step import FinishReason
from otel_llm.server.engine import SamplingParams
from otel_llm.server.engine.sampling import Sampler


def _sampler():
    return Sampler(torch.Generator().manual_seed(0))


def test_temperature_zero_and_top_k_one_are_argmax():
    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(3))
    argmax = logits.argmax(-1).tolist()
    sampler = _sampler()
    assert sampler(logits, [SamplingParams(temperature=0.0)] * 16, [None] * 16) == argmax
    assert sampler(logits, [SamplingParams(temperature=1.5, top_k=1)] * 16, [None] * 16) == argmax
    assert sampler(logits, [SamplingParams(temperature=1.0, top_p=1e-6)] * 16, [None] * 16) == argmax
    mixed = [SamplingParams(temperature=0.0) if i % 2 else SamplingParams(temperature=1.0) for i in range(16)]
    got = sampler(logits, mixed, [None] * 16)
    assert [got[i] for i in range(1, 16, 2)] == [argmax[i] for i in range(1, 16, 2)]


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(4)).repeat(400, 1)
    order = logits[0].argsort(descending=True).tolist()
    sampler = _sampler()
    got = set(sampler(logits, [SamplingParams(top_k=3)] * 400, [None] * 400))
    assert got <= set(order[:3]) and len(got) > 1
    probs = torch.softmax(logits[0], -1)[order]
    nucleus = int((probs.cumsum(0) < 0.5).sum()) + 1
    got = set(sampler(logits, [SamplingParams(top_p=0.5)] * 400, [None] * 400))
    assert got <= set(order[:nucleus]) and len(got) > 1


def test_seed_reproducible_whatever_the_batch(dummy, make_engine):
    prompt = dummy.tokenizer.encode("seeded prompt")
    seeded = SamplingParams(temperature=1.0, seed=42, max_tokens=16, ignore_eos=True)
    alone = make_engine()
    alone.add_request(0, prompt, seeded)
    want = run_to_completion(alone)[0][(0, 0)]
    crowd = make_engine()
    for rid in range(5):
        crowd.add_request(rid, dummy.tokenizer.encode(f"other {rid}"), dataclasses.replace(seeded, seed=None))
    crowd.add_request(9, prompt, seeded)
    assert run_to_completion(crowd)[0][(9, 0)] == want
    other = make_engine()
    other.add_request(0, prompt, dataclasses.replace(seeded, seed=43))
    assert run_to_completion(other)[0][(0, 0)] != want


def _greedy_run(dummy, make_engine, prompt, max_tokens=24):
    engine = make_engine()
    engine.add_request(0, prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    tokens, texts, _, _ = run_to_completion(engine)
    return tokens[(0, 0)], texts[(0, 0)]


def test_stop_token_ids_and_max_tokens(dummy, make_engine):
    prompt = dummy.tokenizer.encode("stop me")
    ids, _ = _greedy_run(dummy, make_engine, prompt)
    k = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])
    engine = make_engine()
    engine.add_request(0, prompt, SamplingParams(temperature=0, max_tokens=24, stop_token_ids=(ids[k],)))
    engine.add_request(1, prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    tokens, _, reasons, _ = run_to_completion(engine)
    assert tokens[(0, 0)] == ids[:k + 1] and reasons[(0, 0)] == FinishReason.STOP
    assert tokens[(1, 0)] == ids[:5] and reasons[(1, 0)] == FinishReason.LENGTH


def test_stop_string_is_cut_from_the_text(dummy, make_engine):
    prompt = dummy.tokenizer.encode("hello")
    ids, text = _greedy_run(dummy, make_engine, prompt, max_tokens=40)
    # a two-character stop string that first appears a few characters in
    at = next(i for i in range(3, len(text) - 2) if "\ufffd" not in text[i:i + 2] and text.find(text[i:i + 2]) == i)
    stop = text[at:at + 2]
    engine = make_engine()
    engine.add_request(0, prompt, SamplingParams(temperature=0, max_tokens=40, stop=[stop, "never-there"]))
    tokens, texts, reasons, _ = run_to_completion(engine)
    assert texts[(0, 0)] == text[:at]
    assert reasons[(0, 0)] == FinishReason.STOP
    assert tokens[(0, 0)] == ids[:len(tokens[(0, 0)])] and len(tokens[(0, 0)]) < 40


def test_eos_stops_unless_ignored(dummy, make_engine):
    prompt = dummy.tokenizer.encode("pretend eos")
    ids, _ = _greedy_run(dummy, make_engine, prompt)
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    eos_config = dataclasses.replace(dummy.config, eos_token_ids=(ids[k],))
    model = dataclasses.replace(dummy, config=eos_config)
    engine = make_engine(model)
    engine.add_request(0, prompt, SamplingParams(temperature=0, max_tokens=24))
    engine.add_request(1, prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    tokens, _, reasons, _ = run_to_completion(engine)
    assert tokens[(0, 0)] == ids[:k + 1] and reasons[(0, 0)] == FinishReason.STOP
    assert tokens[(1, 0)] == ids and reasons[(1, 0)] == FinishReason.LENGTH


def test_n2_sequences_share_the_prompt(dummy, make_engine):
    prompt = dummy.tokenizer.encode("two answers please, sharing one prompt")  # a partial last block
    engine = make_engine(block_size=16)
    engine.add_request(0, prompt, SamplingParams(temperature=0, n=2, max_tokens=10, ignore_eos=True))
    engine.add_request(1, prompt, SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=10, ignore_eos=True))
    tokens, _, reasons, _ = run_to_completion(engine)
    greedy = reference_greedy(dummy.config, dummy.weights, prompt, 10)
    assert tokens[(0, 0)] == tokens[(0, 1)] == greedy  # copy-on-write kept both KV histories right
    assert tokens[(1, 0)] != tokens[(1, 1)]
    assert set(reasons) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


@pytest.mark.parametrize("bad", [
    dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2),
    dict(max_tokens=0), dict(n=0), dict(stop=("",)),
])
def test_bad_sampling_params_raise(bad):
    (name, value), = bad.items()
    with pytest.raises(ValueError, match=name):
        SamplingParams(**bad)
