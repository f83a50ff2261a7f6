"""KV-cache block residency, sampled: vLLM's `--kv-cache-metrics` (`KVCacheMetricsCollector`).

An engine's block manager calls `allocated` when it hands a free block out, `accessed` when a
prefix-cache hit takes a block again, and `evicted` when a block's cached contents are dropped
(the block is handed out for new tokens). A sampled block (each allocation is sampled with
probability `sample_rate`) yields one `KVEvictions` entry when evicted: its lifetime
(allocation -> eviction), its idle time before eviction (last access or allocation ->
eviction) and the gaps between its last `ACCESS_HISTORY` accesses (prefix-cache hits; the
allocation is not one), exactly as vLLM computes them. `drain()` hands the step's evictions to `StepRecorder.kv_evictions`.

Engine-loop thread only. Memory is bounded by the block count (one entry per sampled block) plus
the evictions of one step.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

ACCESS_HISTORY = 4  # vLLM's BlockMetricsState.access_history maxlen


class KVEvictions(NamedTuple):
    """Sampled blocks evicted in one step: int64 ns arrays (lifetime and idle per block; the
    reuse gaps of all of them together)."""

    lifetime_ns: np.ndarray
    idle_ns: np.ndarray
    reuse_gap_ns: np.ndarray


class KVResidencySampler:
    """Tracks a sample of KV blocks from allocation to eviction."""

    def __init__(self, sample_rate: float = 0.01, clock: Callable[[], int] = time.monotonic_ns,
                 rng: Callable[[], float] = random.random):
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)) or not 0 < sample_rate <= 1:
            raise ValueError(f"kv_cache_metrics_sample must be in (0, 1], got {sample_rate!r}")
        self.sample_rate = float(sample_rate)
        self._clock, self._rng = clock, rng
        self._blocks: dict[int, tuple[int, deque]] = {}  # sampled block -> (allocated at, access times)
        self._lifetime: list[int] = []
        self._idle: list[int] = []
        self._gaps: list[int] = []

    def allocated(self, block: int) -> None:
        if self._rng() < self.sample_rate:
            now = self._clock()
            self._blocks[block] = (now, deque(maxlen=ACCESS_HISTORY))

    def accessed(self, block: int) -> None:
        state = self._blocks.get(block)
        if state is not None:
            state[1].append(self._clock())

    def evicted(self, block: int) -> None:
        state = self._blocks.pop(block, None)
        if state is None:
            return
        now, (born, history) = self._clock(), state
        self._lifetime.append(now - born)
        self._idle.append(now - (history[-1] if history else born))
        self._gaps.extend(b - a for a, b in zip(history, list(history)[1:]))

    def reset(self) -> None:
        """The cache was reset: forget every block (as vLLM does)."""
        self._blocks.clear()
        self._lifetime, self._idle, self._gaps = [], [], []

    def drain(self) -> KVEvictions | None:
        """The evictions since the last drain (None: none)."""
        if not self._lifetime:
            return None
        out = KVEvictions(np.array(self._lifetime, np.int64), np.array(self._idle, np.int64),
                          np.array(self._gaps, np.int64))
        self._lifetime, self._idle, self._gaps = [], [], []
        return out
