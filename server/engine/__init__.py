"""The reference engine: paged KV cache, continuous batching, chunked prefill, prefix caching.

Public surface: `EngineConfig`, `LLMEngine`, `SamplingParams`, `RequestOutput`,
`StepOutput`. Everything else is internal to the package.
"""

import importlib

_EXPORTS = {"EngineConfig": "config", "LLMEngine": "llm_engine", "RequestOutput": "outputs",
            "StepOutput": "outputs", "SamplingParams": "sampling"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Lazy exports: `otel_llm.server.engine.config` (and the CLI) must not import torch."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'otel_llm.server.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"otel_llm.server.engine.{_EXPORTS[name]}"), name)
