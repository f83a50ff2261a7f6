"""EngineConfig validation and the engine package's public surface."""

from __future__ import annotations

import pytest
import torch

import otel_llm.server.engine
from otel_llm.server.engine import EngineConfig, LLMEngine
from otel_llm.server.engine.llm_engine import _resolve_dtype


@pytest.mark.parametrize("field, value", [
    ("model", ""), ("model", "/no/such/model"), ("dtype", "float64"), ("device", "tpu"), ("max_num_seqs", 0),
    ("max_num_batched_tokens", -5), ("block_size", 0), ("num_kv_blocks", 0), ("max_model_len", -1),
    ("snapshot_interval_s", -1.0), ("num_threads", 0), ("max_num_seqs", True), ("seed", "x"),
])
def test_bad_values_raise_naming_field_and_value(field, value):
    with pytest.raises(ValueError) as excinfo:
        EngineConfig(**{field: value})
    assert field in str(excinfo.value) and repr(value) in str(excinfo.value)


def test_engine_rejects_a_model_len_beyond_the_model_or_the_cache(make_engine):
    with pytest.raises(ValueError, match="max_model_len=4096"):
        make_engine(max_model_len=4096)  # dummy: 2048 positions
    with pytest.raises(ValueError, match="num_kv_blocks=3"):
        make_engine(num_kv_blocks=3, block_size=16, max_model_len=64)


def test_auto_kv_blocks_fit_max_num_seqs_full_sequences(make_engine):
    engine = make_engine(num_kv_blocks=None, max_num_seqs=4, max_model_len=100, block_size=16)
    assert engine.block_manager.num_blocks == 4 * 7


def test_auto_dtype_is_float32_on_cpu_and_bfloat16_on_cuda():
    # bf16 on CPU changed SmolLM2's greedy answers (benchmarks/dtype_bench.py), native bf16 or not
    engine = LLMEngine(EngineConfig(model="dummy", device="cpu", num_kv_blocks=512, num_threads=1))
    model = engine.runner.model
    assert model.embed.dtype is torch.float32 and model.kv_cache.dtype is torch.float32
    assert _resolve_dtype("auto", torch.device("cuda", 0)) == "bfloat16"
    assert _resolve_dtype("bfloat16", torch.device("cpu")) == "bfloat16"


def test_public_surface():
    assert sorted(otel_llm.server.engine.__all__) == ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "StepOutput"]
