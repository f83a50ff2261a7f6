"""Continuous batching: which sequences compute how many tokens this step."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from otel_llm.engine.step import Blocked

from .block_manager import BlockManager
from .request import Request
from .sequence import Sequence


@dataclass
class SchedulerOutput:
    """One step's plan. `seqs[i]` computes `num_new_tokens[i]` tokens from its `num_computed_tokens`."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    scheduled: list[Request] = field(default_factory=list)  # moved from waiting to running
    preempted: list[Request] = field(default_factory=list)
    num_prompt_tokens: int = 0  # prompt positions computed this step
    blocked: Blocked = Blocked.NONE  # why the head of the waiting queue was not scheduled


class Scheduler:
    """vLLM-v1-style unified scheduling under a per-step token budget.

    Running requests go first, oldest first (decodes cost one token each, partial
    prefills take what budget is left: chunked prefill). When blocks run out, the
    newest running request is preempted by recompute: its blocks are freed and it
    goes back to the front of the waiting queue. Waiting requests are admitted in
    FIFO order while budget, `max_num_seqs` and blocks allow, and never in a step
    that preempted. Engine-loop thread only.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0  # cumulative, requests

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            plan = self._plan(request, budget)
            if not self._make_room(request, plan, out):
                break  # it preempted itself: it was the newest, nothing runs after it
            budget -= self._commit(plan, out)
            i += 1
        if not out.preempted:
            self._admit(out, budget)
        elif self.waiting:
            out.blocked = Blocked.KV  # a step that preempted admits nothing: the KV cache is full
        return out

    def _make_room(self, request: Request, plan, out: SchedulerOutput) -> bool:
        """Allocate the plan, preempting the newest running requests until it fits.

        False when `request` itself had to be preempted.
        """
        while not self._allocate(plan, out):
            victim = self.running.pop()
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        return True

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        num_seqs = sum(r.num_reserved_seqs for r in self.running)
        while self.waiting:
            if budget <= 0:
                out.blocked = Blocked.TOKENS
                break
            request = self.waiting[0]
            if num_seqs + request.num_reserved_seqs > self.max_num_seqs:
                out.blocked = Blocked.SLOTS
                break
            seqs = request.unfinished_seqs
            computed = [bm.get_computed_blocks(s) for s in seqs]
            plan, left = [], budget
            for seq, blocks in zip(seqs, computed):
                n = min(seq.num_tokens - len(blocks) * bm.block_size, left)
                plan.append((seq, n))
                left -= n
            if not self._allocate(plan, out, computed, count_prefix=request.num_schedules == 0):
                out.blocked = Blocked.KV
                break
            self.waiting.popleft()
            if request.num_schedules == 0:
                request.num_cached_tokens = len(computed[0]) * bm.block_size
            request.num_schedules += 1
            self.running.append(request)
            out.scheduled.append(request)
            num_seqs += request.num_reserved_seqs
            budget -= self._commit(plan, out)

    @staticmethod
    def _plan(request: Request, budget: int) -> list[tuple[Sequence, int]]:
        plan = []
        for seq in request.seqs:
            if seq.finish_reason is None and budget > 0:
                n = min(seq.num_tokens - seq.num_computed_tokens, budget)
                plan.append((seq, n))
                budget -= n
        return plan

    def _allocate(self, plan, out: SchedulerOutput, computed=None, count_prefix: bool = False) -> bool:
        """All of the plan's blocks or none (checked before anything is taken).

        `computed`: per planned sequence, its prefix-cache hit blocks (waiting requests only).
        """
        bm = self.block_manager
        computed = computed or [()] * len(plan)
        needed = sum(bm.num_blocks_needed(s, n, c) for (s, n), c in zip(plan, computed))
        # sibling sequences may revive the same cached blocks: count those once
        revived = [b for blocks in computed for b in blocks if bm.ref_counts[b] == 0]
        needed -= len(revived) - len(set(revived))
        if needed > bm.num_free_blocks:
            return False
        for k, ((seq, n), blocks) in enumerate(zip(plan, computed)):
            copies = bm.allocate_slots(seq, n, blocks, count_prefix=count_prefix and k == 0)
            out.blocks_to_copy.extend(copies)
        return True

    @staticmethod
    def _commit(plan, out: SchedulerOutput) -> int:
        total = 0
        for seq, n in plan:
            if n > 0:
                out.seqs.append(seq)
                out.num_new_tokens.append(n)
                start = seq.num_computed_tokens
                out.num_prompt_tokens += max(0, min(start + n, seq.num_prompt_tokens) - start)
                total += n
        return total

    def _preempt(self, request: Request) -> None:
        for seq in request.unfinished_seqs:
            self.block_manager.free(seq)
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def remove(self, request: Request) -> None:
        """Take a finished or aborted request out of the queues (its blocks must be freed)."""
        if request in self.waiting:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
