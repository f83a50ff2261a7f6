"""The model shape every loader produces and the engine consumes."""
from __future__ import annotations

import dataclasses

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Shape and special tokens of a Llama-architecture decoder.

    ``head_dim * num_heads`` need not equal ``hidden_size``. ``num_heads`` is a
    multiple of ``num_kv_heads`` (grouped-query attention). ``dtype`` is the
    dtype of every weight matrix; RMSNorm weights are always float32.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids must not be empty")


def resolve_dtype(dtype: str) -> torch.dtype:
    """Map ``"float32" | "bfloat16"`` to a torch dtype (``--dtype auto`` is the engine's to resolve)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of 'float32', 'bfloat16'")
    return _DTYPES[dtype]


def is_norm_weight(name: str) -> bool:
    """True for RMSNorm weights, which stay float32 whatever the model dtype."""
    return name.endswith("norm.weight")


def cast_weights(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Cast matrices to ``dtype`` and norms to float32; returns contiguous tensors."""
    return {
        name: w.to(torch.float32 if is_norm_weight(name) else dtype).contiguous()
        for name, w in weights.items()
    }


def expected_weight_names(config: LlamaConfig) -> list[str]:
    """The Hugging Face Llama weight names a loaded model must provide."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    return names
