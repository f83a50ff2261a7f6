"""The paged forward matches a plain full-attention forward, for mixed prefill/decode batches."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_helpers import reference_logits

from otel_llm.server.engine.block_manager import BlockManager
from otel_llm.server.engine.model_runner import ModelRunner
from otel_llm.server.engine.sequence import Sequence
from otel_llm.server.model import LlamaConfig

BLOCK_SIZE = 4


def _tiny_tied_model():
    """A random GQA model with tied embeddings and head_dim * heads != hidden."""
    config = LlamaConfig(
        vocab_size=50, hidden_size=24, intermediate_size=40, num_layers=2, num_heads=6, num_kv_heads=2,
        head_dim=8, rope_theta=500.0, rms_eps=1e-6, max_position_embeddings=128,
        tie_word_embeddings=True, bos_token_id=None, eos_token_ids=(49,), dtype=torch.float32,
    )
    g = torch.Generator().manual_seed(0)
    h, hd = config.hidden_size, config.head_dim
    w = {"model.embed_tokens.weight": torch.randn(50, h, generator=g), "model.norm.weight": torch.rand(h, generator=g) + 0.5}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.rand(h, generator=g) + 0.5
        w[p + "post_attention_layernorm.weight"] = torch.rand(h, generator=g) + 0.5
        w[p + "self_attn.q_proj.weight"] = torch.randn(6 * hd, h, generator=g) / h**0.5
        w[p + "self_attn.k_proj.weight"] = torch.randn(2 * hd, h, generator=g) / h**0.5
        w[p + "self_attn.v_proj.weight"] = torch.randn(2 * hd, h, generator=g) / h**0.5
        w[p + "self_attn.o_proj.weight"] = torch.randn(h, 6 * hd, generator=g) / (6 * hd)**0.5
        w[p + "mlp.gate_proj.weight"] = torch.randn(40, h, generator=g) / h**0.5
        w[p + "mlp.up_proj.weight"] = torch.randn(40, h, generator=g) / h**0.5
        w[p + "mlp.down_proj.weight"] = torch.randn(h, 40, generator=g) / 40**0.5
    return config, w


def _all_position_logits(runner: ModelRunner, seqs, nums):
    """Logits of every new position in the batch, per sequence."""
    batch = runner._prepare(seqs, nums, [])
    positions = batch.positions.tolist()
    batch = dataclasses.replace(batch, logits_indices=torch.arange(len(positions)))
    logits = runner.model.forward(batch)
    per_seq, flat = {}, 0
    order = [i for i, n in enumerate(nums) if n > 1] + [i for i, n in enumerate(nums) if n == 1]
    for i in order:
        per_seq[i] = (positions[flat:flat + nums[i]], logits[flat:flat + nums[i]])
        flat += nums[i]
    return per_seq


@pytest.mark.parametrize("model", ["dummy", "tiny_tied"])
def test_paged_forward_matches_plain_forward(model, dummy):
    config, weights = (dummy.config, dummy.weights) if model == "dummy" else _tiny_tied_model()
    vocab = config.vocab_size
    runner = ModelRunner(config, weights, 128, torch.device("cpu"), torch.float32, seed=0)
    runner.allocate_kv_cache(64, BLOCK_SIZE)
    bm = BlockManager(64, BLOCK_SIZE, enable_prefix_caching=False)
    g = torch.Generator().manual_seed(1)
    full = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (23, 11, 6, 9)]
    # step 1: seq 0 prefills a first chunk, seqs 1 and 2 whole prompts, seq 3 one token
    seqs = [Sequence(None, 0, list(ids[:-1]), len(ids) - 1, None) for ids in full]
    plans = [[9, 10, 5, 1], [13, 1, 1, 7]]
    for step, nums in enumerate(plans):
        for seq, n in zip(seqs, nums):
            assert bm.allocate_slots(seq, n) is not None
        got = _all_position_logits(runner, seqs, nums)
        for i, (seq, n) in enumerate(zip(seqs, nums)):
            positions, logits = got[i]
            assert positions == list(range(seq.num_computed_tokens, seq.num_computed_tokens + n))
            want = reference_logits(config, weights, full[i][:seq.num_computed_tokens + n])[positions]
            torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)
            seq.num_computed_tokens += n
            if step == 0 and seq.num_computed_tokens == seq.num_tokens:
                seq.token_ids.append(full[i][seq.num_tokens])  # the "sampled" token, decoded next step


def test_copy_blocks_copies_every_layer(dummy):
    runner = ModelRunner(dummy.config, dummy.weights, 64, torch.device("cpu"), torch.float32, seed=0)
    runner.allocate_kv_cache(8, BLOCK_SIZE)
    kv = runner.model.kv_cache
    kv[:, :, 3] = torch.randn_like(kv[:, :, 3])
    runner.model.copy_blocks([(3, 5)])
    assert torch.equal(kv[:, :, 5], kv[:, :, 3])
