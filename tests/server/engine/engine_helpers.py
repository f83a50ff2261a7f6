"""Test helpers: a plain (non-paged, no KV cache) Llama forward, the ground truth the
paged engine must match, and a loop that runs an engine to completion."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms_norm(x, weight, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.inference_mode()
def reference_logits(config, weights, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), vocab] float32 of one sequence with causal attention."""
    w, n, hd = weights, len(ids), config.head_dim
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    angles = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    group = config.num_heads // config.num_kv_heads
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], config.rms_eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, config.num_heads, hd).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, config.num_kv_heads, hd).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, config.num_kv_heads, hd).transpose(0, 1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + attn.transpose(0, 1).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], config.rms_eps)
        x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[
            p + "mlp.down_proj.weight"].T
    x = _rms_norm(x, w["model.norm.weight"], config.rms_eps)
    head = w["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"]
    return (x @ head.T).float()


def reference_greedy(config, weights, ids: list[int], max_new_tokens: int, stop_ids=()) -> list[int]:
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(reference_logits(config, weights, ids + out)[-1].argmax())
        out.append(token)
        if token in stop_ids:
            break
    return out


def run_to_completion(engine):
    """Step until idle. Returns ({(rid, seq): token ids}, {(rid, seq): text}, {(rid, seq): reason}, [telemetry])."""
    tokens: dict = {}
    texts: dict = {}
    reasons: dict = {}
    telemetry = []
    while engine.has_unfinished():
        step = engine.step()
        telemetry.append(step.telemetry)
        for out in step.outputs:
            key = (out.rid, out.seq_index)
            tokens.setdefault(key, []).extend(out.new_token_ids)
            texts[key] = texts.get(key, "") + out.text_delta
            if out.finished:
                assert key not in reasons, f"{key} finished twice"
                reasons[key] = out.finish_reason
    return tokens, texts, reasons, telemetry
