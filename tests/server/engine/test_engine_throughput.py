"""Decode throughput of the dummy model at 64 concurrent sequences (prints; never asserts on time)."""

from __future__ import annotations

import time

import pytest

from otel_llm.server.engine import EngineConfig, LLMEngine, SamplingParams


@pytest.mark.slow
@pytest.mark.parametrize("num_threads", [1, 2])
def test_dummy_decode_throughput_64_sequences(dummy, num_threads, capsys):
    engine = LLMEngine(EngineConfig(max_num_seqs=64, num_threads=num_threads, dtype="float32", device="cpu"), dummy)
    params = SamplingParams(temperature=0.8, seed=None, max_tokens=128, ignore_eos=True)
    for rid in range(64):
        engine.add_request(rid, dummy.tokenizer.encode(f"request {rid}: " + "lorem ipsum " * 5), params)
    generated = sum(len(o.new_token_ids) for o in engine.step().outputs)  # prefill of all 64 prompts
    start = time.perf_counter()
    steps = 0
    while engine.has_unfinished():
        generated += sum(len(o.new_token_ids) for o in engine.step().outputs)
        steps += 1
    elapsed = time.perf_counter() - start
    assert generated == 64 * 128
    with capsys.disabled():
        print(f"\ndummy decode, 64 seqs, {num_threads} thread(s): {(64 * 127) / elapsed:,.0f} tok/s "
              f"({elapsed / steps * 1e3:.2f} ms/step)")
