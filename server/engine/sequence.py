"""One generated sequence: its tokens, its place in the KV cache, its text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_llm.engine.step import FinishReason

if TYPE_CHECKING:
    from .request import Request


class Sequence:
    """Token ids (prompt + output) and KV-cache state of one of a request's `n` sequences.

    Invariant between steps: `block_table` holds ceil(num_computed_tokens /
    block_size) block ids; position p of the sequence lives in
    `block_table[p // block_size]` at offset `p % block_size`. The newest sampled
    token is never computed yet (num_computed_tokens < num_tokens while unfinished).
    Owned by the engine-loop thread.
    """

    __slots__ = (
        "request", "index", "token_ids", "num_prompt_tokens", "num_computed_tokens",
        "block_table", "block_hashes", "finish_reason", "decoder", "text", "num_sent_chars",
        "num_sent_tokens",
    )

    def __init__(self, request: Request, index: int, token_ids: list[int], num_prompt_tokens: int, decoder):
        self.request = request
        self.index = index
        self.token_ids = token_ids
        self.num_prompt_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chain hashes of full blocks, a pure function of token_ids
        self.finish_reason: FinishReason | None = None
        self.decoder = decoder  # incremental detokenizer, or None (no tokenizer)
        self.text = ""  # output text so far (stop strings cut off)
        self.num_sent_chars = 0  # of `text`, already returned as deltas
        self.num_sent_tokens = 0  # of the output ids, already returned

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def fork(self, index: int, decoder) -> Sequence:
        """A sibling sharing this sequence's tokens and blocks (the block manager counts the references)."""
        child = Sequence(self.request, index, list(self.token_ids), self.num_prompt_tokens, decoder)
        child.num_computed_tokens = self.num_computed_tokens
        child.block_table = list(self.block_table)
        child.block_hashes = list(self.block_hashes)
        return child

    def reset_for_recompute(self) -> None:
        """After preemption: nothing is computed any more (the blocks were freed)."""
        self.num_computed_tokens = 0
        self.block_table = []
