"""A plain (non-paged, no KV cache) Llama forward, only to prove weights are right."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from otel_llm.server.model import LlamaConfig


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(seq_len: int, config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / config.rope_theta ** (
        torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim
    )
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # [seq, head_dim]
    return angles.cos(), angles.sin()


def forward(config: LlamaConfig, weights: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), vocab] (float32) of one sequence, causal attention."""
    w = weights
    n, hd = len(ids), config.head_dim
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    cos, sin = _rope(n, config)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], config.rms_eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, config.num_heads, hd).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, config.num_kv_heads, hd).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, config.num_kv_heads, hd).transpose(0, 1)
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(x.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(x.dtype)
        group = config.num_heads // config.num_kv_heads
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + attn.transpose(0, 1).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], config.rms_eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = _rms_norm(x, w["model.norm.weight"], config.rms_eps)
    lm_head = w["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"]
    return (x @ lm_head.T).float()


def greedy(
    config: LlamaConfig, weights: dict[str, torch.Tensor], ids: list[int], max_new_tokens: int, stop_ids=None
) -> list[int]:
    """Greedy continuation of ``ids``, stopping after a stop id (default: the EOS ids)."""
    stop_ids = config.eos_token_ids if stop_ids is None else stop_ids
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            nxt = int(forward(config, weights, ids + out)[-1].argmax())
            out.append(nxt)
            if nxt in stop_ids:
                break
    return out
