"""``load_model``: resolve a model spec into config, weights and tokenizer;
``load_tokenizer``: the same spec's tokenizer alone."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from otel_llm.server.model.config import LlamaConfig, resolve_dtype
from otel_llm.server.model.specs import BUILTIN_MODELS, DUMMY, NULL, SMOLLM2  # noqa: F401 (re-exported)
from otel_llm.server.model.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """Everything the engine needs to serve one model.

    ``weights`` maps Hugging Face Llama names to contiguous CPU tensors in
    ``config.dtype`` (RMSNorm weights in float32). Q/K projections are in HF
    layout, for rotate_half RoPE. ``lm_head.weight`` is absent when
    ``config.tie_word_embeddings``. The tensors are shared: do not mutate.
    ``weights`` is None for the ``"null"`` model, which has no forward pass: the
    engine samples its tokens with a ``NullRunner``.
    """

    name: str
    config: LlamaConfig
    weights: dict[str, torch.Tensor] | None
    tokenizer: Tokenizer


def load_model(spec: str, dtype: str = "float32") -> LoadedModel:
    """Load ``"dummy"``, ``"null"``, ``"smollm2"`` or a local Hugging Face Llama directory.

    ``dtype`` is ``"float32"`` or ``"bfloat16"``. The served name is the spec, or
    the directory's basename. ``"smollm2"`` may download ~93 MB on first use
    (see ``ensure_smollm2_gguf``). Raises ValueError naming the bad spec,
    dtype, file or key.
    """
    torch_dtype = resolve_dtype(dtype)
    name, path = _locate(spec)
    if path is None:
        from otel_llm.server.model import dummy

        config = dummy.dummy_config(torch_dtype)
        weights = None if name == NULL else dummy.dummy_weights(config)
        return LoadedModel(name, config, weights, dummy.dummy_tokenizer())
    if path.is_dir():
        from otel_llm.server.model.hf_loader import load_hf_dir

        return LoadedModel(name, *load_hf_dir(path, torch_dtype))
    from otel_llm.server.model.gguf_loader import load_gguf

    return LoadedModel(name, *load_gguf(path, torch_dtype))


def load_tokenizer(spec: str) -> Tokenizer:
    """``load_model(spec).tokenizer`` without building any weight.

    For a process that only tokenizes (the API process): a GGUF file is read
    for its metadata only, a Hugging Face directory for ``tokenizer.json``,
    ``tokenizer_config.json`` and ``config.json``. Raises ValueError like
    ``load_model``.
    """
    _, path = _locate(spec)
    if path is None:
        from otel_llm.server.model.dummy import dummy_tokenizer

        return dummy_tokenizer()
    if path.is_dir():
        from otel_llm.server.model.hf_loader import load_hf_tokenizer

        return load_hf_tokenizer(path)
    from otel_llm.server.model.gguf_loader import load_gguf_tokenizer

    return load_gguf_tokenizer(path)


def _locate(spec: str) -> tuple[str, Path | None]:
    """The served name of ``spec`` and its GGUF file or HF directory (None: the
    built-in dummy or null). May download the smollm2 file; raises ValueError naming the spec."""
    if spec in (DUMMY, NULL):
        return spec, None
    if spec == SMOLLM2:
        from otel_llm.server.model.smollm2_gguf import ensure_smollm2_gguf

        return SMOLLM2, ensure_smollm2_gguf()
    path = Path(spec).expanduser()
    if spec and path.is_dir():
        return path.resolve().name, path
    raise ValueError(
        f"model {spec!r} is not {DUMMY!r}, {NULL!r}, {SMOLLM2!r} or an existing Hugging Face model directory"
    )
