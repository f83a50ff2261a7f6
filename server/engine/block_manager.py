"""KV-cache block accounting: reference counts, a free list, prefix caching. Pure integers."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq

from otel_llm.engine.kv_residency import KVResidencySampler

from .sequence import Sequence


def chain_hash(parent_hash: int | None, token_ids: Seq[int]) -> int:
    """Hash of one full block given the hash of the block before it (None for the first).

    64-bit Python tuple hashing: deterministic for ints; a collision would share a
    wrong block, which at 2**-64 per lookup is accepted (nano-vllm does the same).
    """
    return hash((parent_hash, tuple(token_ids)))


class BlockManager:
    """Owns which KV blocks hold which sequence positions. Engine-loop thread only.

    A block is free when its reference count is 0. Free blocks wait in LRU order;
    a free block that still holds a full, hashed block of tokens can be revived
    by a prefix-cache hit until it is handed out for new tokens. Blocks are shared
    by reference count: between requests with a common prefix, and between the
    `n` sequences of one request (a shared partial block is copied on write).

    Prefix-cache counters `prefix_queries` / `prefix_hits` are cumulative tokens,
    counted once per request at its first admission (`allocate_slots(count_prefix=True)`).

    `residency` (vLLM's `--kv-cache-metrics`) sees a block allocated when it is handed out,
    accessed when a prefix-cache hit takes it, and evicted when it is handed out again (its
    old contents dropped), as vLLM's block pool reports them.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 residency: KVResidencySampler | None = None):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._block_hash: list[int | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.residency = residency

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (0..1); cached-but-free blocks count as free."""
        return 1.0 - len(self._free) / self.num_blocks

    def _hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """Chain hashes of the sequence's first `num_full_blocks` blocks (cached on it)."""
        hashes, bs, ids = seq.block_hashes, self.block_size, seq.token_ids
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            hashes.append(chain_hash(hashes[-1] if hashes else None, ids[i * bs:(i + 1) * bs]))
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Longest run of cached blocks matching the sequence's full blocks.

        The last token is never taken from the cache: its logits are needed.
        Nothing changes until `allocate_slots` takes the blocks.
        """
        if not self.enable_prefix_caching:
            return []
        blocks = []
        for h in self._hashes(seq, (seq.num_tokens - 1) // self.block_size):
            block = self._hash_to_block.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> int:
        """Free blocks `allocate_slots` would take (new blocks, copy-on-write, revived cache hits)."""
        num_computed = seq.num_computed_tokens + len(computed_blocks) * self.block_size
        have = len(seq.block_table) + len(computed_blocks)
        want = -(-(num_computed + num_new_tokens) // self.block_size)
        needed = max(0, want - have) + sum(1 for b in computed_blocks if self.ref_counts[b] == 0)
        if self._needs_copy(seq, num_new_tokens):
            needed += 1
        return needed

    def _needs_copy(self, seq: Sequence, num_new_tokens: int) -> bool:
        """True when the next token goes into a partial block shared with a sibling."""
        offset = seq.num_computed_tokens % self.block_size
        return num_new_tokens > 0 and offset != 0 and self.ref_counts[seq.block_table[-1]] > 1

    def allocate_slots(
        self,
        seq: Sequence,
        num_new_tokens: int,
        computed_blocks: Seq[int] = (),
        count_prefix: bool = False,
    ) -> list[tuple[int, int]] | None:
        """Give the sequence blocks for `num_new_tokens` more tokens.

        `computed_blocks` (from `get_computed_blocks`, only when nothing is computed
        yet) are taken first and advance `seq.num_computed_tokens`. Returns the
        (src, dst) block copies the model runner must do before the forward
        (copy-on-write of a shared partial block), or None, changing nothing, when
        there are not enough free blocks.
        """
        if self.num_blocks_needed(seq, num_new_tokens, computed_blocks) > len(self._free):
            return None
        bs = self.block_size
        if count_prefix and self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += len(computed_blocks) * bs
        for block in computed_blocks:
            if self.ref_counts[block] == 0:
                del self._free[block]
            self.ref_counts[block] += 1
            seq.block_table.append(block)
            if self.residency is not None:
                self.residency.accessed(block)
        seq.num_computed_tokens += len(computed_blocks) * bs
        copies = []
        if self._needs_copy(seq, num_new_tokens):
            src = seq.block_table[-1]
            dst = self._take_free_block()
            self.ref_counts[src] -= 1
            seq.block_table[-1] = dst
            copies.append((src, dst))
        end = seq.num_computed_tokens + num_new_tokens
        while len(seq.block_table) * bs < end:
            seq.block_table.append(self._take_free_block())
        if self.enable_prefix_caching:
            first, last = seq.num_computed_tokens // bs, end // bs
            if last > first:
                hashes = self._hashes(seq, last)
                for i in range(first, last):
                    self._register(seq.block_table[i], hashes[i])
        return copies

    def _take_free_block(self) -> int:
        block, _ = self._free.popitem(last=False)
        h = self._block_hash[block]
        if h is not None:
            self._block_hash[block] = None
            if self._hash_to_block.get(h) == block:
                del self._hash_to_block[h]
        self.ref_counts[block] = 1
        if self.residency is not None:
            self.residency.evicted(block)
            self.residency.allocated(block)
        return block

    def _register(self, block: int, h: int) -> None:
        # A block's content never changes once full, so the first block seen for a hash stays canonical.
        if self._block_hash[block] is None:
            self._block_hash[block] = h
            self._hash_to_block.setdefault(h, block)

    def fork(self, child: Sequence) -> None:
        """Count a forked sequence's references to the blocks it copied from its parent."""
        for block in child.block_table:
            self.ref_counts[block] += 1

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; blocks reaching 0 join the free list.

        Tail blocks are freed first so they are evicted before the shared prefix.
        """
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None
        seq.reset_for_recompute()
