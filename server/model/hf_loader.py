"""Load a local Hugging Face Llama checkpoint directory."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer as BackendTokenizer

from otel_llm.server.model.config import LlamaConfig, cast_weights, expected_weight_names
from otel_llm.server.model.tokenizer import Tokenizer

_ARCHITECTURES = ("LlamaForCausalLM",)
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_hf_dir(path: Path, dtype: torch.dtype) -> tuple[LlamaConfig, dict[str, torch.Tensor], Tokenizer]:
    """Read ``config.json``, ``*.safetensors`` and ``tokenizer.json`` from ``path``.

    Sharded checkpoints need ``model.safetensors.index.json``. The chat template
    and BOS/EOS strings come from ``tokenizer_config.json`` when present. Raises
    ValueError naming the path and key for a missing file, a missing weight, a
    non-Llama architecture or an unsupported feature (rope_scaling, biases).
    """
    raw = _read_json(path / "config.json")
    config = _config(path, raw, dtype)
    weights = {
        name: w
        for name, w in _read_safetensors(path).items()
        if not name.endswith(_IGNORED_SUFFIXES)
    }
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    missing = [n for n in expected_weight_names(config) if n not in weights]
    if missing:
        raise ValueError(f"{path}: checkpoint lacks weight {missing[0]!r} ({len(missing)} missing)")
    return config, cast_weights(weights, dtype), _tokenizer(path, config.eos_token_ids)


def load_hf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of ``load_hf_dir(path)`` from ``tokenizer.json``,
    ``tokenizer_config.json`` and ``config.json`` (its EOS ids) alone: no
    safetensors file is opened. Raises ValueError like ``load_hf_dir``."""
    return _tokenizer(path, _eos_token_ids(path, _read_json(path / "config.json")))


def _read_json(file: Path) -> dict:
    if not file.is_file():
        raise ValueError(f"{file}: file not found")
    return json.loads(file.read_text())


def _config(path: Path, raw: dict, dtype: torch.dtype) -> LlamaConfig:
    archs = raw.get("architectures") or []
    if not any(a in _ARCHITECTURES for a in archs) and raw.get("model_type") != "llama":
        raise ValueError(
            f"{path / 'config.json'}: architectures={archs!r}, model_type={raw.get('model_type')!r}; "
            f"only {_ARCHITECTURES} is supported"
        )
    for key in ("rope_scaling", "attention_bias", "mlp_bias"):
        if raw.get(key):
            raise ValueError(f"{path / 'config.json'}: {key}={raw[key]!r} is not supported")
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        return LlamaConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_eos_token_ids(path, raw),
            dtype=dtype,
        )
    except KeyError as exc:
        raise ValueError(f"{path / 'config.json'}: missing key {exc.args[0]!r}") from None


def _eos_token_ids(path: Path, raw: dict) -> tuple[int, ...]:
    """``eos_token_id`` of ``config.json``: one id or a list of them."""
    if "eos_token_id" not in raw:
        raise ValueError(f"{path / 'config.json'}: missing key 'eos_token_id'")
    eos = raw["eos_token_id"]
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index)["weight_map"].values()))
        files = [path / shard for shard in shards]
    else:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{path}: no *.safetensors file")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        if not file.is_file():
            raise ValueError(f"{file}: file not found (listed in {index.name})")
        weights.update(load_file(file))
    return weights


def _tokenizer(path: Path, eos_token_ids: tuple[int, ...]) -> Tokenizer:
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{file}: file not found")
    backend = BackendTokenizer.from_file(str(file))
    tok_config_file = path / "tokenizer_config.json"
    tok_config = _read_json(tok_config_file) if tok_config_file.is_file() else {}
    return Tokenizer(
        backend,
        eos_token_ids=eos_token_ids,
        chat_template=_chat_template(tok_config.get("chat_template")),
        bos_token=_token_text(tok_config.get("bos_token")),
        eos_token=_token_text(tok_config.get("eos_token")),
    )


def _chat_template(value: str | list | None) -> str | None:
    """Tokenizer configs hold one template or a list of named ones."""
    if isinstance(value, list):
        named = {t["name"]: t["template"] for t in value}
        return named.get("default")
    return value


def _token_text(value: str | dict | None) -> str:
    if isinstance(value, dict):
        return value.get("content", "")
    return value or ""
