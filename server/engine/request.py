"""One request: a prompt, its sampling parameters and its `n` sequences."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .sampling import SamplingParams
from .sequence import Sequence


class Request:
    """A request as the scheduler sees it; engine-loop thread only.

    Until its first token a request has one sequence, which computes the prompt;
    its first sampling draws `n` tokens and forks the other sequences, which
    share the prompt's KV blocks. `rid` is the frontend's int64 handle.
    """

    __slots__ = (
        "rid", "prompt_token_ids", "params", "seqs", "generators", "num_cached_tokens",
        "num_schedules", "_new_decoder",
    )

    def __init__(
        self,
        rid: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        new_decoder: Callable[[], object] | None = None,
    ):
        self.rid = rid
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self._new_decoder = new_decoder or (lambda: None)
        self.seqs = [Sequence(self, 0, list(prompt_token_ids), len(prompt_token_ids), self._new_decoder())]
        self.generators: list[torch.Generator | None] = [None] * params.n
        if params.seed is not None:
            for i in range(params.n):
                g = torch.Generator()
                g.manual_seed((params.seed + i * 0x9E3779B97F4A7C15) % 2**63)
                self.generators[i] = g
        self.num_cached_tokens = 0  # prefix-cache hit at the first scheduling, tokens
        self.num_schedules = 0  # times moved from waiting to running

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def needs_fork(self) -> bool:
        """True until the first sampling has created all `n` sequences."""
        return len(self.seqs) < self.params.n

    @property
    def unfinished_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if s.finish_reason is None]

    @property
    def num_reserved_seqs(self) -> int:
        """Sequences this request counts against max_num_seqs (all n until they finish)."""
        return self.params.n - sum(1 for s in self.seqs if s.finish_reason is not None)

    @property
    def finished(self) -> bool:
        return not self.needs_fork and all(s.finish_reason is not None for s in self.seqs)

    def fork(self) -> list[Sequence]:
        """Create sequences 1..n-1 as copies of sequence 0; returns the new ones."""
        parent = self.seqs[0]
        children = [parent.fork(i, self._new_decoder()) for i in range(1, self.params.n)]
        self.seqs.extend(children)
        return children
