"""Model loading for the reference serving stack.

``load_model(spec, dtype)`` returns a ``LoadedModel``: a ``LlamaConfig``,
Hugging Face-named weights and a ``Tokenizer`` (with streaming
``IncrementalDecoder``). Specs: ``"dummy"``, ``"smollm2"``, or a local HF
Llama directory. ``load_tokenizer(spec)`` returns the same ``Tokenizer``
without loading weights, for a process that only tokenizes.
"""
from server.model.config import LlamaConfig
from server.model.incremental_decoder import IncrementalDecoder
from server.model.loaded_model import LoadedModel, load_model, load_tokenizer
from server.model.smollm2_gguf import ensure_smollm2_gguf
from server.model.tokenizer import Tokenizer

__all__ = [
    "IncrementalDecoder",
    "LlamaConfig",
    "LoadedModel",
    "Tokenizer",
    "ensure_smollm2_gguf",
    "load_model",
    "load_tokenizer",
]
