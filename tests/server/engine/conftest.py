"""Shared fixtures: the dummy model in float32 and an engine factory with a small KV cache."""

from __future__ import annotations

import pytest

from otel_llm.server.engine import EngineConfig, LLMEngine
from otel_llm.server.model import load_model


@pytest.fixture(scope="session")
def dummy():
    return load_model("dummy", "float32")


@pytest.fixture
def make_engine(dummy):
    def make(loaded=None, **kwargs) -> LLMEngine:
        kwargs.setdefault("num_kv_blocks", 512)
        kwargs.setdefault("num_threads", 1)
        kwargs.setdefault("dtype", "float32")
        kwargs.setdefault("device", "cpu")
        return LLMEngine(EngineConfig(**kwargs), loaded or dummy)

    return make
