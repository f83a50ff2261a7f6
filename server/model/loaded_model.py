"""``load_model``: resolve a model spec into config, weights and tokenizer."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from server.model.config import LlamaConfig, resolve_dtype
from server.model.tokenizer import Tokenizer

DUMMY = "dummy"
SMOLLM2 = "smollm2"


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """Everything the engine needs to serve one model.

    ``weights`` maps Hugging Face Llama names to contiguous CPU tensors in
    ``config.dtype`` (RMSNorm weights in float32). Q/K projections are in HF
    layout, for rotate_half RoPE. ``lm_head.weight`` is absent when
    ``config.tie_word_embeddings``. The tensors are shared: do not mutate.
    """

    name: str
    config: LlamaConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer


def load_model(spec: str, dtype: str = "auto") -> LoadedModel:
    """Load ``"dummy"``, ``"smollm2"`` or a local Hugging Face Llama directory.

    ``dtype`` is ``"auto"`` (bfloat16 where the CPU has native bf16, else
    float32), ``"float32"`` or ``"bfloat16"``. The served name is the spec, or
    the directory's basename. ``"smollm2"`` may download ~93 MB on first use
    (see ``ensure_smollm2_gguf``). Raises ValueError naming the bad spec,
    dtype, file or key.
    """
    torch_dtype = resolve_dtype(dtype)
    if spec == DUMMY:
        from server.model import dummy

        config = dummy.dummy_config(torch_dtype)
        return LoadedModel(DUMMY, config, dummy.dummy_weights(config), dummy.dummy_tokenizer())
    if spec == SMOLLM2:
        from server.model.gguf_loader import load_gguf
        from server.model.smollm2_gguf import ensure_smollm2_gguf

        return LoadedModel(SMOLLM2, *load_gguf(ensure_smollm2_gguf(), torch_dtype))
    path = Path(spec).expanduser()
    if spec and path.is_dir():
        from server.model.hf_loader import load_hf_dir

        return LoadedModel(path.resolve().name, *load_hf_dir(path, torch_dtype))
    raise ValueError(
        f"model {spec!r} is not {DUMMY!r}, {SMOLLM2!r} or an existing Hugging Face model directory"
    )
