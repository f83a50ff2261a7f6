"""Load a llama-architecture GGUF file as Hugging Face-layout weights."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from otel_llm.server.model.config import LlamaConfig, cast_weights, expected_weight_names
from otel_llm.server.model.tokenizer import Tokenizer

_CONTROL_TOKEN_TYPE = 3
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def load_gguf(path: Path, dtype: torch.dtype) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]:
    """Read config, dequantised weights and tokenizer from a llama GGUF file.

    Q/K rows are un-permuted from llama.cpp's interleaved-pair RoPE layout back
    to Hugging Face's rotate_half layout. Raises ValueError for a non-llama
    architecture, a non-BPE tokenizer, or a missing or unknown tensor.
    """
    reader = GGUFReader(path)
    meta = _metadata(reader, path)
    unknown = [t.name for t in reader.tensors if _hf_name(t.name) is None]
    if unknown:
        raise ValueError(f"{path}: unsupported GGUF tensor {unknown[0]!r}")
    weights = {_hf_name(t.name): _dequantize(t) for t in reader.tensors}
    config = _config(meta, dtype, tied="lm_head.weight" not in weights)
    missing = [n for n in expected_weight_names(config) if n not in weights]
    if missing:
        raise ValueError(f"{path}: missing weight {missing[0]!r} ({len(missing)} missing)")
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}.self_attn."
        weights[prefix + "q_proj.weight"] = _unpermute(weights[prefix + "q_proj.weight"], config.num_heads)
        weights[prefix + "k_proj.weight"] = _unpermute(weights[prefix + "k_proj.weight"], config.num_kv_heads)
    return config, cast_weights(weights, dtype), _tokenizer(meta)


def load_gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of ``load_gguf(path)``, from the metadata alone: no tensor
    is read or dequantised. Raises ValueError like ``load_gguf``."""
    return _tokenizer(_metadata(GGUFReader(path), path))


def _metadata(reader: GGUFReader, path: Path) -> dict:
    """The key/value fields of a llama GGUF file; raises ValueError for another architecture."""
    meta = {name: field.contents() for name, field in reader.fields.items()}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: general.architecture is {arch!r}, only 'llama' is supported")
    return meta


def _config(meta: dict, dtype: torch.dtype, tied: bool) -> LlamaConfig:
    hidden = int(meta["llama.embedding_length"])
    heads = int(meta["llama.attention.head_count"])
    return LlamaConfig(
        vocab_size=int(meta.get("llama.vocab_size", len(meta["tokenizer.ggml.tokens"]))),
        hidden_size=hidden,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_layers=int(meta["llama.block_count"]),
        num_heads=heads,
        num_kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        head_dim=int(meta.get("llama.rope.dimension_count", hidden // heads)),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        # Stored as float32: take its shortest decimal form (1e-05, not 9.9999997e-06).
        rms_eps=float(str(np.float32(meta["llama.attention.layer_norm_rms_epsilon"]))),
        max_position_embeddings=int(meta["llama.context_length"]),
        tie_word_embeddings=tied,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_eos_token_ids(meta),
        dtype=dtype,
    )


def _eos_token_ids(meta: dict) -> tuple[int, ...]:
    return (int(meta["tokenizer.ggml.eos_token_id"]),)


def _hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None if it has none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")  # blk.{i}.{kind}.weight
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _dequantize(tensor) -> torch.Tensor:
    """Float32 tensor in torch (row-major, HF) dimension order."""
    array = dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed(tensor.shape.tolist())))
    # F32 tensors come back as read-only views of the mmap; copy them out.
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Invert convert_hf_to_gguf's ``permute`` on a Q or K projection."""
    out_dim, in_dim = w.shape
    return w.reshape(n_head, out_dim // n_head // 2, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def _tokenizer(meta: dict) -> Tokenizer:
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"tokenizer.ggml.model {model!r} is not supported (only byte-level BPE 'gpt2')")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    backend = BackendTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    # llama.cpp's "smollm" pre-tokenizer: single digits, then GPT-2 byte-level split.
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    token_types = meta["tokenizer.ggml.token_type"]
    control = [t for t, kind in zip(tokens, token_types) if kind == _CONTROL_TOKEN_TYPE]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_ids = _eos_token_ids(meta)
    return Tokenizer(
        backend,
        eos_token_ids=eos_ids,
        chat_template=meta.get("tokenizer.chat_template"),
        bos_token=tokens[bos_id] if bos_id is not None else "",
        eos_token=tokens[eos_ids[0]],
    )
