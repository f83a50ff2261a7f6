"""load_gguf on a tiny GGUF written here from the dummy model (hermetic)."""
import numpy as np
import pytest
import torch
from gguf import GGUFWriter

from otel_llm.server.model import load_model
from otel_llm.server.model.dummy import CHAT_TEMPLATE, SPECIAL_TOKENS
from otel_llm.server.model.gguf_loader import load_gguf

from .reference_forward import forward

_GGUF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's Q/K permutation (HF rotate_half -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf_name: str) -> str:
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf_name in fixed:
        return fixed[hf_name]
    _, _, layer, *kind, _ = hf_name.split(".")
    return f"blk.{layer}.{_GGUF_NAMES['.'.join(kind)]}.weight"


def _write_gguf(path, model, arch="llama"):
    c, tok = model.config, model.tokenizer
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_eps)
    vocab = tok.backend.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])
    writer.add_token_merges([])
    writer.add_bos_token_id(c.bos_token_id)
    writer.add_eos_token_id(c.eos_token_ids[0])
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, w in model.weights.items():
        array = w.numpy()
        if name.endswith("q_proj.weight"):
            array = _permute(array, c.num_heads)
        elif name.endswith("k_proj.weight"):
            array = _permute(array, c.num_kv_heads)
        writer.add_tensor(_gguf_name(name), np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def dummy():
    return load_model("dummy", dtype="float32")


def test_gguf_round_trip_unpermutes_q_and_k(dummy, tmp_path):
    config, weights, tok = load_gguf(_write_gguf(tmp_path / "d.gguf", dummy), torch.float32)
    assert config == dummy.config
    assert sorted(weights) == sorted(dummy.weights)
    for name, w in weights.items():
        assert torch.equal(w, dummy.weights[name]), name
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "héllo"}]))
    assert ids == dummy.tokenizer.encode(dummy.tokenizer.apply_chat_template([{"role": "user", "content": "héllo"}]))
    assert torch.equal(forward(config, weights, ids), forward(config, dummy.weights, ids))


def test_non_llama_architecture_is_named(dummy, tmp_path):
    with pytest.raises(ValueError, match="'qwen2'"):
        load_gguf(_write_gguf(tmp_path / "q.gguf", dummy, arch="qwen2"), torch.float32)
