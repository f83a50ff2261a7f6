"""Block accounting: reference counts, the free list, prefix caching, n > 1 sharing."""

from __future__ import annotations

from otel_llm.server.engine.block_manager import BlockManager
from otel_llm.server.engine.sequence import Sequence

BS = 4


def seq(ids) -> Sequence:
    return Sequence(None, 0, list(ids), len(ids), None)


def test_allocate_and_free_return_blocks():
    bm = BlockManager(8, BS)
    s = seq(range(10))
    assert bm.num_blocks_needed(s, 10) == 3
    assert bm.allocate_slots(s, 10) == []
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    assert all(bm.ref_counts[b] == 1 for b in s.block_table)
    assert bm.usage == 3 / 8
    s.num_computed_tokens = 10
    s.token_ids += [10, 11, 12]
    assert bm.num_blocks_needed(s, 2) == 0  # 12 tokens still fit in 3 blocks
    assert bm.num_blocks_needed(s, 3) == 1
    bm.free(s)
    assert s.block_table == [] and s.num_computed_tokens == 0
    assert bm.num_free_blocks == 8 and bm.usage == 0.0


def test_allocate_fails_without_enough_blocks_and_changes_nothing():
    bm = BlockManager(2, BS)
    s = seq(range(9))
    assert bm.allocate_slots(s, 9) is None
    assert s.block_table == [] and bm.num_free_blocks == 2


def test_prefix_cache_hits_counted_in_tokens():
    bm = BlockManager(16, BS)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # 2 full blocks + 2 tokens
    assert bm.get_computed_blocks(a) == []
    bm.allocate_slots(a, a.num_tokens, (), count_prefix=True)
    a.num_computed_tokens = a.num_tokens
    assert (bm.prefix_queries, bm.prefix_hits) == (10, 0)

    b = seq([1, 2, 3, 4, 5, 6, 7, 8, 42, 43, 44])  # shares the 2-block prefix
    hit = bm.get_computed_blocks(b)
    assert hit == a.block_table[:2]
    bm.allocate_slots(b, b.num_tokens - 2 * BS, hit, count_prefix=True)
    assert b.num_computed_tokens == 8
    assert b.block_table[:2] == a.block_table[:2]
    assert [bm.ref_counts[x] for x in b.block_table] == [2, 2, 1]
    assert (bm.prefix_queries, bm.prefix_hits) == (21, 8)

    c = seq([9, 2, 3, 4, 5, 6, 7, 8, 9])  # first block differs: the chain hash misses everything
    assert bm.get_computed_blocks(c) == []


def test_last_token_never_comes_from_the_cache():
    bm = BlockManager(16, BS)
    a = seq(range(8))
    bm.allocate_slots(a, 8)
    b = seq(range(8))  # identical, exactly 2 blocks: only the first may hit
    assert bm.get_computed_blocks(b) == a.block_table[:1]


def test_freed_blocks_stay_cached_until_reused():
    bm = BlockManager(4, BS)
    a = seq(range(9))
    bm.allocate_slots(a, 9)
    blocks = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 4
    b = seq(range(9))
    hit = bm.get_computed_blocks(b)
    assert hit == blocks[:2]
    assert bm.num_blocks_needed(b, 1, hit) == 3  # two revived + one new
    bm.allocate_slots(b, 1, hit)
    assert bm.num_free_blocks == 1
    bm.free(b)
    # a different prompt reuses every block: the old hashes are evicted
    c = seq(range(100, 116))
    bm.allocate_slots(c, 16)
    assert bm.get_computed_blocks(seq(range(9))) == []


def test_prefix_caching_off_never_hits_or_counts():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a = seq(range(9))
    bm.allocate_slots(a, 9, count_prefix=True)
    assert bm.get_computed_blocks(seq(range(9))) == []
    assert (bm.prefix_queries, bm.prefix_hits) == (0, 0)


def test_fork_shares_blocks_and_copies_the_partial_one_on_write():
    bm = BlockManager(8, BS)
    parent = seq(range(6))  # one full block, one partial
    bm.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    parent.token_ids.append(100)
    child = parent.fork(1, None)
    bm.fork(child)
    assert child.block_table == parent.block_table
    assert [bm.ref_counts[b] for b in parent.block_table] == [2, 2]
    child.token_ids[-1] = 200
    # the child writes position 6 into the shared partial block: copy on write
    assert bm.num_blocks_needed(child, 1) == 1
    copies = bm.allocate_slots(child, 1)
    assert copies == [(parent.block_table[1], child.block_table[1])]
    assert child.block_table[0] == parent.block_table[0]
    assert [bm.ref_counts[b] for b in parent.block_table] == [2, 1]
    # the parent is now the only owner of its partial block: no copy
    assert bm.allocate_slots(parent, 1) == []
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 8 and all(r == 0 for r in bm.ref_counts)


class Residency:
    """Records the block manager's residency calls (the real sampler is tested in tests/otel_llm)."""

    def __init__(self):
        self.calls = []

    def allocated(self, block):
        self.calls.append(("allocated", block))

    def accessed(self, block):
        self.calls.append(("accessed", block))

    def evicted(self, block):
        self.calls.append(("evicted", block))


def test_residency_sees_allocation_prefix_hits_and_eviction_as_vllm_reports_them():
    r = Residency()
    bm = BlockManager(3, BS, residency=r)
    a = seq(range(9))
    bm.allocate_slots(a, 9)
    first = list(a.block_table)
    assert r.calls == [c for b in first for c in (("evicted", b), ("allocated", b))]
    bm.free(a)
    r.calls.clear()
    b = seq(range(9))
    hit = bm.get_computed_blocks(b)
    bm.allocate_slots(b, 1, hit)
    # two hits; the last token goes into the first free block: the old partial one, handed out again
    assert r.calls == [("accessed", first[0]), ("accessed", first[1]), ("evicted", first[2]), ("allocated", first[2])]
    bm.free(b)
    r.calls.clear()
    c = seq(range(100, 112))
    bm.allocate_slots(c, 12)  # every block handed out again: each evicted, then allocated
    assert sorted(r.calls) == sorted(c for blk in first for c in (("evicted", blk), ("allocated", blk)))
