"""Turns a scheduled step into tensors, runs the model, samples the next tokens."""

from __future__ import annotations

import torch

from otel_llm.server.model import LlamaConfig

from .forward_timer import forward_timer
from .model import ForwardBatch, LlamaModel
from .sampling import Sampler, SamplingParams
from .sequence import Sequence


class ModelRunner:
    """Owns the model, its KV cache and the sampler. Engine-loop thread only."""

    def __init__(
        self,
        config: LlamaConfig,
        weights: dict,
        max_model_len: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
    ):
        self.device = device
        self.block_size = 0
        self.model = LlamaModel(config, weights, max_model_len, device, dtype)
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        self.sampler = Sampler(generator)
        self.timer = forward_timer(device)  # the forward pass of each step (the engine lane)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.model.allocate_kv_cache(num_blocks, block_size)

    def run(
        self,
        seqs: list[Sequence],
        num_new_tokens: list[int],
        blocks_to_copy: list[tuple[int, int]],
        sample_rows: list[tuple[int, SamplingParams, torch.Generator | None]],
    ) -> list[int]:
        """Compute `num_new_tokens[i]` tokens of `seqs[i]` (from its num_computed_tokens).

        `sample_rows`: (index into `seqs`, params, generator) per token to sample from
        that sequence's last new position; an index may repeat (n > 1 fork).
        Returns one token id per sample row. Does not advance num_computed_tokens.
        """
        self.model.copy_blocks(blocks_to_copy)
        batch = self._prepare(seqs, num_new_tokens, [i for i, _, _ in sample_rows])
        self.timer.start()
        logits = self.model.forward(batch)  # rows in sample_rows order
        self.timer.stop()
        return self.sampler(logits, [p for _, p, _ in sample_rows], [g for _, _, g in sample_rows])

    def _prepare(self, seqs: list[Sequence], num_new_tokens: list[int], sample_seq_indices: list[int]) -> ForwardBatch:
        bs = self.block_size
        prefill = [i for i, n in enumerate(num_new_tokens) if n > 1]
        decode = [i for i, n in enumerate(num_new_tokens) if n == 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_flat = [0] * len(seqs)
        prefills = []
        for i in prefill:
            seq, n = seqs[i], num_new_tokens[i]
            start, table = seq.num_computed_tokens, seq.block_table
            flat = len(input_ids)
            input_ids.extend(seq.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            context = start + n
            blocks = torch.tensor(table[:-(-context // bs)], dtype=torch.int64, device=self.device)
            q_pos = torch.arange(start, context, device=self.device).unsqueeze(1)
            mask = torch.arange(context, device=self.device).unsqueeze(0) <= q_pos
            prefills.append((flat, n, context, blocks, mask))
            last_flat[i] = flat + n - 1
        num_prefill_tokens = len(input_ids)
        tables, mask = None, None
        if decode:
            width = max(len(seqs[i].block_table) for i in decode)
            rows, ctx = [], []
            for i in decode:
                seq = seqs[i]
                p = seq.num_computed_tokens
                last_flat[i] = len(input_ids)
                input_ids.append(seq.token_ids[p])
                positions.append(p)
                table = seq.block_table
                slots.append(table[p // bs] * bs + p % bs)
                rows.append(table + [0] * (width - len(table)))
                ctx.append(p + 1)
            tables = torch.tensor(rows, dtype=torch.int64, device=self.device)
            lens = torch.tensor(ctx, dtype=torch.int64, device=self.device)
            mask = (torch.arange(width * bs, device=self.device) < lens.unsqueeze(1))[:, None, None, :]
        dev = self.device
        return ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            prefills=prefills,
            num_prefill_tokens=num_prefill_tokens,
            decode_block_tables=tables,
            decode_mask=mask,
            logits_indices=torch.tensor([last_flat[i] for i in sample_seq_indices], dtype=torch.int64, device=dev),
        )
