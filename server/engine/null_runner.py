"""`NullRunner`: the `ModelRunner` of the `"null"` model, which samples without a forward pass."""

from __future__ import annotations

import time

import torch

from .sampling import SamplingParams
from .sequence import Sequence

# Output token k of every sequence is CYCLE[k % len(CYCLE)]: ASCII "a".."z", one byte token per
# character in the dummy tokenizer, never EOS, so max_tokens (or a stop string) ends a request.
CYCLE = tuple(range(ord("a"), ord("z") + 1))


class NullRunner:
    """`ModelRunner`'s interface with no model, no KV tensors and no sampler.

    The engine around it is unchanged (scheduler, block accounting, detokenization,
    stop conditions, telemetry), so `"null"` measures everything but the model.
    `step_s` > 0 paces it: a step starts at most once per `step_s` (the runner sleeps
    what the engine loop left of it), like a GPU whose forward pass takes that long.
    Engine-loop thread only.
    """

    block_size = 0
    timer = None  # no forward pass to time

    def __init__(self, step_s: float = 0.0):
        self.step_s = step_s
        self._next = 0.0  # monotonic s: the next step's run returns no earlier

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """No tensors: the block manager's integer accounting is all the KV cache there is."""
        self.block_size = block_size

    def run(
        self,
        seqs: list[Sequence],
        num_new_tokens: list[int],
        blocks_to_copy: list[tuple[int, int]],
        sample_rows: list[tuple[int, SamplingParams, torch.Generator | None]],
    ) -> list[int]:
        """One token per sample row: the cycle's token at the sequence's next output position."""
        if self.step_s:
            now = time.monotonic()
            if now < self._next:
                time.sleep(self._next - now)
            self._next = max(now, self._next) + self.step_s
        return [CYCLE[seqs[k].num_output_tokens % len(CYCLE)] for k, _, _ in sample_rows]
