"""Model loading for the reference serving stack.

``load_model(spec, dtype)`` returns a ``LoadedModel``: a ``LlamaConfig``,
Hugging Face-named weights and a ``Tokenizer`` (with streaming
``IncrementalDecoder``). Specs: ``"dummy"``, ``"null"`` (the dummy's config and
tokenizer, no weights), ``"smollm2"``, or a local HF Llama directory.
``load_tokenizer(spec)`` returns the same ``Tokenizer`` without loading
weights, for a process that only tokenizes.
"""
import importlib

_EXPORTS = {
    "IncrementalDecoder": "incremental_decoder", "LlamaConfig": "config", "LoadedModel": "loaded_model",
    "Tokenizer": "tokenizer", "ensure_smollm2_gguf": "smollm2_gguf", "load_model": "loaded_model",
    "load_tokenizer": "loaded_model",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Lazy exports: `otel_llm.server.model.specs` (and the CLI) must not import torch."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'otel_llm.server.model' has no attribute {name!r}")
    return getattr(importlib.import_module(f"otel_llm.server.model.{_EXPORTS[name]}"), name)
