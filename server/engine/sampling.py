"""Sampling parameters of a request and the vectorised sampler of a batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request. Invalid values raise ValueError naming them.

    temperature 0 is greedy (argmax). top_k 0 or -1 and top_p 1.0 are off.
    `seed` makes the request's sampling reproducible whatever batch it runs in
    (each of its `n` sequences gets its own generator). `stop` strings end a
    sequence and are not part of its text; `stop_token_ids` and EOS (unless
    `ignore_eos`) end it too (finish reason STOP); `max_tokens` ends it with LENGTH.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature={self.temperature!r}: must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1]")
        if self.top_k < -1:
            raise ValueError(f"top_k={self.top_k!r}: must be >= 1, or 0/-1 for off")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r}: must be >= 1")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed={self.seed!r}: must be an int or None")
        if self.n < 1:
            raise ValueError(f"n={self.n!r}: must be >= 1")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop={self.stop!r}: must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class Sampler:
    """Picks one token per row of a logits batch.

    Greedy rows take the argmax. Random rows use the exponential race
    (argmax of probs / Exp(1) noise, equivalent to multinomial sampling): the noise
    of rows with their own generator is drawn per row, the rest in one call.
    """

    def __init__(self, generator: torch.Generator):
        self._generator = generator

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> list[int]:
        """`logits` [B, V]; `params`/`generators` one per row (CPU generators). Returns B token ids."""
        if all(p.greedy for p in params):
            return logits.argmax(dim=-1).tolist()
        dev = logits.device
        logits = logits.float()
        greedy_ids = logits.argmax(dim=-1)
        greedy = torch.tensor([p.greedy for p in params], device=dev)
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=dev)
        logits = logits / temps.unsqueeze(1)
        top_k = [p.top_k if p.top_k > 0 else 0 for p in params]
        top_p = [p.top_p for p in params]
        if any(top_k) or any(p < 1.0 for p in top_p):
            logits = _apply_top_k_top_p(logits, top_k, top_p)
        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs)
        shared = [i for i, g in enumerate(generators) if g is None]
        if shared:
            noise[shared] = torch.empty(len(shared), probs.shape[1], device=dev).exponential_(
                generator=self._generator)
        for i, g in enumerate(generators):
            if g is not None:
                # per-request noise is drawn on the CPU: the same stream on every device
                noise[i] = torch.empty(probs.shape[1]).exponential_(generator=g).to(dev)
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(greedy, greedy_ids, sampled).tolist()


def _apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask logits outside each row's top-k and nucleus (top-p) to -inf."""
    dev = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[1]
    k = torch.tensor([kk if kk > 0 else vocab for kk in top_k], device=dev).clamp(max=vocab)
    ranks = torch.arange(vocab, device=dev).unsqueeze(0)
    mask = ranks >= k.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
    p = torch.tensor(top_p, device=dev).unsqueeze(1)
    probs = torch.softmax(sorted_logits, dim=-1)
    # keep a token while the mass before it is < top_p (the first token always survives)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
