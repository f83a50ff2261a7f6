"""The ``dummy`` model: seeded weights, byte tokenizer, non-degenerate output."""
import pytest
import torch

from otel_llm.server.model import load_model
from otel_llm.server.model.config import expected_weight_names

from .reference_forward import forward, greedy


@pytest.fixture(scope="module")
def model():
    return load_model("dummy", dtype="float32")


def test_shape_is_small_gqa(model):
    c = model.config
    assert model.name == "dummy"
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (2, 128, 4, 2, 32)
    assert c.num_kv_heads < c.num_heads
    assert c.vocab_size == model.tokenizer.vocab_size == 260
    assert c.eos_token_ids == model.tokenizer.eos_token_ids == (258,)
    assert not c.tie_word_embeddings


def test_weights_have_hf_names_and_shapes(model):
    c, w = model.config, model.weights
    assert sorted(w) == sorted(expected_weight_names(c))
    assert w["model.layers.0.self_attn.q_proj.weight"].shape == (c.num_heads * c.head_dim, c.hidden_size)
    assert w["model.layers.1.self_attn.k_proj.weight"].shape == (c.num_kv_heads * c.head_dim, c.hidden_size)
    assert w["model.layers.1.mlp.down_proj.weight"].shape == (c.hidden_size, c.intermediate_size)
    assert w["lm_head.weight"].shape == (c.vocab_size, c.hidden_size)
    assert all(t.is_contiguous() for t in w.values())


def test_weights_are_deterministic_across_loads(model):
    again = load_model("dummy", dtype="float32")
    assert again.config == model.config
    for name, tensor in model.weights.items():
        assert torch.equal(tensor, again.weights[name]), name


def test_bfloat16_casts_matrices_but_keeps_norms_float32(model):
    bf = load_model("dummy", dtype="bfloat16")
    assert bf.config.dtype is torch.bfloat16
    for name, tensor in bf.weights.items():
        expected = torch.float32 if name.endswith("norm.weight") else torch.bfloat16
        assert tensor.dtype is expected, name
    torch.testing.assert_close(
        bf.weights["lm_head.weight"].float(), model.weights["lm_head.weight"], rtol=1e-2, atol=1e-2
    )


def test_logits_are_not_degenerate_and_greedy_follows_prompt(model):
    tok = model.tokenizer
    prompts = ["hello", "What is the capital of France?", "abc", "The quick brown fox"]
    outputs = set()
    for text in prompts:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
        logits = forward(model.config, model.weights, ids)
        assert torch.isfinite(logits).all()
        assert 1.0 < logits[-1].std() < 10.0
        outputs.add(tuple(greedy(model.config, model.weights, ids, 16)))
    assert len(outputs) == len(prompts)


def test_eos_is_rare_but_possible(model):
    tok = model.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "tell me a story"}]))
    out = greedy(model.config, model.weights, ids, 48)
    probs = forward(model.config, model.weights, ids + out).softmax(-1)[:, 258]
    assert 1e-5 < probs.mean().item() < 0.05
