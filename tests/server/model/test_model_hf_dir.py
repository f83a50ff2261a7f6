"""Local Hugging Face Llama directories: config, (sharded) safetensors, tokenizer."""
import json

import pytest
import torch
from safetensors.torch import save_file

from otel_llm.server.model import load_model
from otel_llm.server.model.config import expected_weight_names
from otel_llm.server.model.dummy import CHAT_TEMPLATE, dummy_tokenizer

from .reference_forward import forward


def _hf_config(**overrides) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 260,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 24,  # deliberately != hidden_size / heads
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "bos_token_id": 257,
        "eos_token_id": [258, 256],
        "torch_dtype": "float32",
    }
    return {**config, **overrides}


def _random_weights(cfg: dict) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    h, hd, ff = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
        shapes |= {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.o_proj.weight": (h, q)}
        shapes |= {p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.v_proj.weight": (kv, h)}
        shapes |= {p + "mlp.gate_proj.weight": (ff, h), p + "mlp.up_proj.weight": (ff, h)}
        shapes |= {p + "mlp.down_proj.weight": (h, ff), p + "self_attn.rotary_emb.inv_freq": (hd // 2,)}
    return {name: torch.randn(shape, generator=gen) * 0.2 for name, shape in shapes.items()}


def _write_dir(path, cfg: dict, weights: dict[str, torch.Tensor], shards: int = 1):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    names = sorted(weights)
    if shards == 1:
        save_file(weights, str(path / "model.safetensors"))
    else:
        weight_map = {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: weights[n].contiguous() for n in names[s::shards]}
            save_file(part, str(path / file))
            weight_map |= dict.fromkeys(part, file)
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    dummy_tokenizer().backend.save(str(path / "tokenizer.json"))
    tok_config = {"chat_template": CHAT_TEMPLATE, "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}}
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return path


@pytest.fixture
def tiny_dir(tmp_path):
    cfg = _hf_config()
    return _write_dir(tmp_path / "tiny-llama", cfg, _random_weights(cfg), shards=3)


def test_sharded_tied_checkpoint_loads(tiny_dir):
    m = load_model(str(tiny_dir), dtype="float32")
    c = m.config
    assert m.name == "tiny-llama"
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (3, 64, 4, 1, 24)
    assert c.tie_word_embeddings and c.rope_theta == 500000.0
    assert c.eos_token_ids == m.tokenizer.eos_token_ids == (258, 256)
    assert sorted(m.weights) == sorted(expected_weight_names(c))  # no inv_freq, no lm_head
    assert m.weights["model.layers.2.self_attn.q_proj.weight"].shape == (96, 64)
    logits = forward(c, m.weights, m.tokenizer.encode("hello"))
    assert logits.shape == (5, 260) and torch.isfinite(logits).all()


def test_tokenizer_and_chat_template_come_from_the_directory(tiny_dir):
    tok = load_model(str(tiny_dir), dtype="float32").tokenizer
    assert tok.decode(tok.encode("héllo 😀")) == "héllo 😀"
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]).startswith("<|im_start|>user\nx")


def test_dummy_saved_as_hf_dir_round_trips(tmp_path):
    dummy = load_model("dummy", dtype="float32")
    c = dummy.config
    cfg = _hf_config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, rope_theta=c.rope_theta, rms_norm_eps=c.rms_eps,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=False,
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_ids[0],
    )
    loaded = load_model(str(_write_dir(tmp_path / "d", cfg, dummy.weights)), dtype="float32")
    assert loaded.config == c
    ids = dummy.tokenizer.encode("round trip")
    assert torch.equal(forward(c, loaded.weights, ids), forward(c, dummy.weights, ids))


def test_bfloat16_load(tiny_dir):
    m = load_model(str(tiny_dir), dtype="bfloat16")
    assert m.weights["model.embed_tokens.weight"].dtype is torch.bfloat16
    assert m.weights["model.norm.weight"].dtype is torch.float32


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json", "model-00002-of-00003.safetensors"])
def test_missing_file_is_named(tiny_dir, missing):
    (tiny_dir / missing).unlink()
    with pytest.raises(ValueError, match=missing):
        load_model(str(tiny_dir))


def test_no_safetensors_is_an_error(tmp_path):
    cfg = _hf_config()
    path = _write_dir(tmp_path / "empty", cfg, _random_weights(cfg))
    (path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no .*safetensors"):
        load_model(str(path))


def test_missing_weight_is_named(tmp_path):
    cfg = _hf_config()
    weights = _random_weights(cfg)
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        load_model(str(_write_dir(tmp_path / "m", cfg, weights)))


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}, "Qwen2ForCausalLM"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
        ({"attention_bias": True}, "attention_bias"),
    ],
)
def test_unsupported_config_is_named(tmp_path, overrides, named):
    cfg = _hf_config(**overrides)
    with pytest.raises(ValueError, match=named):
        load_model(str(_write_dir(tmp_path / "m", cfg, _random_weights(_hf_config()))))


def test_missing_config_key_is_named(tmp_path):
    cfg = _hf_config()
    weights = _random_weights(cfg)
    del cfg["num_hidden_layers"]
    with pytest.raises(ValueError, match="num_hidden_layers"):
        load_model(str(_write_dir(tmp_path / "m", cfg, weights)))
