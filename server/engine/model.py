"""Llama decoder over a paged KV cache (RMSNorm fp32, rotate_half RoPE, GQA, SwiGLU)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from otel_llm.server.model import LlamaConfig


@dataclass(frozen=True)
class ForwardBatch:
    """A flattened batch: prefill chunks first, then single-token (decode) sequences.

    All tensors are on the model's device. T = total tokens, D = decode sequences.

    input_ids, positions, slot_mapping: [T] int64; slot = block * block_size + offset.
    prefills: per prefill chunk (first flat index, num tokens, context length after
        the chunk, block ids [ceil(context / block_size)] int64 tensor, causal mask
        [num, context] bool).
    decode_block_tables: [D, max_blocks] int64, padded with block 0.
    decode_mask: [D, 1, 1, max_blocks * block_size] bool, True for the keys to attend
        to (the context, the new token included).
    logits_indices: [S] int64 flat indices whose logits are wanted.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    prefills: list[tuple[int, int, int, torch.Tensor, torch.Tensor]]
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor | None
    decode_mask: torch.Tensor | None
    logits_indices: torch.Tensor


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaModel:
    """Inference-only Llama; weights in Hugging Face names, Q/K in rotate_half layout.

    Each layer owns K and V caches shaped [num_blocks, block_size, num_kv_heads,
    head_dim] (views of one allocation, made by `allocate_kv_cache`). A forward first writes every new token's
    K/V into its slot, then attends, so a chunk may read blocks that another
    chunk of the same batch fills (shared prefixes). Not thread-safe.
    """

    def __init__(
        self,
        config: LlamaConfig,
        weights: dict[str, torch.Tensor],
        max_positions: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.config = c = config
        self.device, self.dtype = device, dtype

        def w(name: str, norm: bool = False) -> torch.Tensor:
            return weights[name].to(device=device, dtype=torch.float32 if norm else dtype).contiguous()

        self.embed = w("model.embed_tokens.weight")
        self.norm = w("model.norm.weight", norm=True)
        self.lm_head = self.embed if c.tie_word_embeddings else w("lm_head.weight")
        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            self.layers.append((
                w(p + "input_layernorm.weight", norm=True),
                torch.cat([w(p + f"self_attn.{x}_proj.weight") for x in "qkv"]).contiguous(),
                w(p + "self_attn.o_proj.weight"),
                w(p + "post_attention_layernorm.weight", norm=True),
                torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]).contiguous(),
                w(p + "mlp.down_proj.weight"),
            ))
        self.kv_cache = torch.empty(0)
        inv_freq = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self._cos = angles.cos().to(device)
        self._sin = angles.sin().to(device)
        self._scale = c.head_dim ** -0.5

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """[num_layers, 2 (k, v), num_blocks, block_size, num_kv_heads, head_dim].

        Zeroed: a never-written slot must not hold NaN, which a masked-out
        attention weight of 0 would still spread.
        """
        c = self.config
        self.kv_cache = torch.zeros(
            c.num_layers, 2, num_blocks, block_size, c.num_kv_heads, c.head_dim, device=self.device, dtype=self.dtype
        )

    @staticmethod
    def kv_bytes_per_block(config: LlamaConfig, block_size: int, dtype: torch.dtype) -> int:
        elem = torch.empty(0, dtype=dtype).element_size()
        return config.num_layers * 2 * block_size * config.num_kv_heads * config.head_dim * elem

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks src -> dst in every layer (copy-on-write of shared blocks)."""
        if copies:
            src = torch.tensor([s for s, _ in copies], device=self.device)
            dst = torch.tensor([d for _, d in copies], device=self.device)
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [S, vocab] float32 at `batch.logits_indices`."""
        c = self.config
        x = F.embedding(batch.input_ids, self.embed)
        cos = self._cos[batch.positions].unsqueeze(1).to(self.dtype)
        sin = self._sin[batch.positions].unsqueeze(1).to(self.dtype)
        num_q = c.num_heads * c.head_dim
        num_kv = c.num_kv_heads * c.head_dim
        n = x.shape[0]
        for layer, (ln1, qkv_w, o_w, ln2, gate_up_w, down_w) in enumerate(self.layers):
            h = _rms_norm(x, ln1, c.rms_eps)
            q, k, v = F.linear(h, qkv_w).split((num_q, num_kv, num_kv), dim=-1)
            q = q.view(n, c.num_heads, c.head_dim)
            k = k.view(n, c.num_kv_heads, c.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k_cache, v_cache = self.kv_cache[layer]
            k_flat = k_cache.view(-1, c.num_kv_heads, c.head_dim)
            v_flat = v_cache.view(-1, c.num_kv_heads, c.head_dim)
            k_flat.index_copy_(0, batch.slot_mapping, k)
            v_flat.index_copy_(0, batch.slot_mapping, v.view(n, c.num_kv_heads, c.head_dim))
            attn = self._attention(q, k_cache, v_cache, batch)
            x = x + F.linear(attn.reshape(n, num_q), o_w)
            h = _rms_norm(x, ln2, c.rms_eps)
            gate, up = F.linear(h, gate_up_w).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, down_w)
        x = _rms_norm(x[batch.logits_indices], self.norm, c.rms_eps)
        return F.linear(x, self.lm_head).float()

    def _attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch):
        """q [T, heads, head_dim] -> [T, heads, head_dim]."""
        c = self.config
        out = torch.empty_like(q)
        num_blocks = k_cache.shape[0]
        # F.embedding is the fastest whole-block gather on CPU (rows of block_size*kv_heads*head_dim)
        k_rows, v_rows = k_cache.view(num_blocks, -1), v_cache.view(num_blocks, -1)
        for start, num, context, blocks, mask in batch.prefills:
            # one sequence: its keys are the gathered blocks, the chunk's queries end at `context`
            keys = F.embedding(blocks, k_rows).view(-1, c.num_kv_heads, c.head_dim)[:context].transpose(0, 1)
            values = F.embedding(blocks, v_rows).view(-1, c.num_kv_heads, c.head_dim)[:context].transpose(0, 1)
            qs = q[start:start + num].transpose(0, 1)  # [heads, num, d]
            o = F.scaled_dot_product_attention(
                qs.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
                attn_mask=mask, scale=self._scale, enable_gqa=True,
            )
            out[start:start + num] = o[0].transpose(0, 1)
        if batch.decode_block_tables is not None:
            # all decode sequences at once: padded gather of their blocks, one masked SDPA
            tables = batch.decode_block_tables
            d = tables.shape[0]
            keys = F.embedding(tables, k_rows).view(d, -1, c.num_kv_heads, c.head_dim).transpose(1, 2)
            values = F.embedding(tables, v_rows).view(d, -1, c.num_kv_heads, c.head_dim).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q[batch.num_prefill_tokens:].unsqueeze(2), keys, values,
                attn_mask=batch.decode_mask, scale=self._scale, enable_gqa=True,
            )
            out[batch.num_prefill_tokens:] = o.squeeze(2)
        return out
