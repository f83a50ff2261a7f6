"""Goodput: each finished request judged against its SLO objectives, counted in
`otel_llm.slo.requests` by what it missed (`otel_llm.slo.missed`: ``none``, ``ttft``, ``tpot``,
``e2e``, ``errors`` or a ``+``-joined combination, 16 values at most). The rate of ``none`` is the
goodput (DistServe's definition, as `vllm bench --goodput` computes it); the others say which
objective cost it.

A request is judged by the most specific objective set that covers it: one naming its LoRA adapter
and operation, then its adapter, then its operation, then the model (or no scope); a set for another
model is ignored. A request no set covers is not counted. A latency a request does not have (no first
token, fewer than two tokens for TPOT, engine timestamps out of order) is not held against it; the
``errors`` objective is missed by a request that ended in error (an abort by its client is not one).
``itl`` is an objective on tokens, not requests (the rules judge it from the ITL histogram): it plays
no part here. Judging is a handful of numpy operations per folded batch of requests.
"""

from __future__ import annotations

import numpy as np

from otel_llm.canonical.instruments import GOODPUT_KINDS, OPERATIONS, SLO_MISSED, STREAM
from otel_llm.engine.step import FinishReason
from otel_llm.slo.config import ObjectiveSet, SloConfig

GOODPUT = "otel_llm.slo.requests"
_LATENCY = GOODPUT_KINDS[:3]  # ttft, tpot, e2e: the columns of the threshold table
_ERROR = int(FinishReason.ERROR)


class Goodput:
    """One model's objectives as a table, row = (adapter, operation), and the batch judgement."""

    def __init__(self, config: SloConfig, model: str, scale: float = 1e9):
        """`scale`: the unit of the latencies `count` gets, per second (1e9: ns; 1: seconds)."""
        sets = [s for s in config.sets if s.model in (None, model)]
        self.adapters = {name: i + 1 for i, name in
                         enumerate(sorted({s.lora_adapter for s in sets if s.lora_adapter is not None}))}
        rows = [_most_specific(sets, adapter, op) for adapter in (None, *self.adapters) for op in OPERATIONS]
        self.covers = np.array([s is not None for s in rows])
        self.thresholds = np.full((len(rows), len(_LATENCY)), np.inf)
        self.errors = np.zeros(len(rows), bool)
        for r, s in enumerate(rows):
            for o in s.objectives if s is not None else ():
                if o.kind in _LATENCY:
                    self.thresholds[r, _LATENCY.index(o.kind)] = o.threshold * scale
                elif o.kind == "errors":
                    self.errors[r] = True
        self.any = bool(self.covers.any())

    def count(self, counters: np.ndarray, series: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray,
              reason: np.ndarray, adapters: list[str | None] | None = None) -> None:
        """Judge a batch and count it into `counters` (the GOODPUT counter's array). `series`: each
        request's (operation, stream) series; latencies in the table's unit, NaN where a request has
        none; `reason`: FinishReason values; `adapters`: each request's LoRA adapter (only needed
        when a set names one, `self.adapters`)."""
        row = series // len(STREAM)
        if adapters is not None and self.adapters:
            row = row + len(OPERATIONS) * np.array([self.adapters.get(a, 0) for a in adapters], np.int64)
        covered = self.covers[row]
        if not covered.all():
            series, row, ttft, tpot, e2e, reason = (a[covered] for a in (series, row, ttft, tpot, e2e, reason))
        th = self.thresholds[row]
        missed = ((ttft > th[:, 0]).astype(np.int64) | (tpot > th[:, 1]) << 1 | (e2e > th[:, 2]) << 2
                  | (self.errors[row] & (reason == _ERROR)) << 3)
        counters += np.bincount(series * len(SLO_MISSED) + missed, minlength=len(counters))[: len(counters)]


def _most_specific(sets: list[ObjectiveSet], adapter: str | None, operation: str) -> ObjectiveSet | None:
    best, best_score = None, -1
    for s in sets:
        if s.lora_adapter not in (None, adapter) or s.operation not in (None, operation):
            continue
        score = 4 * (s.lora_adapter is not None) + 2 * (s.operation is not None) + (s.model is not None)
        if score > best_score:
            best, best_score = s, score
    return best
