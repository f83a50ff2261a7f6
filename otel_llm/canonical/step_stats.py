"""A step's engine-level stats written into a `MetricsState`: the scheduler's gauges, prefix-cache
counts, speculative decoding and sampled KV block evictions.

The one place these canonical writes live, shared by the frontend's request table (otel-llm's
own step records) and the vLLM plugin (vLLM's stats objects): each caller checks and converts
what it was given, these functions only write. Not thread-safe: callers hold their state's lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from otel_llm.canonical.instruments import DIMENSIONS, MAX_SPEC_POSITIONS
from otel_llm.canonical.metrics_state import MetricsState

_TIERS = {tier: i for i, tier in enumerate(DIMENSIONS["otel_llm.cache_source"])}
_KV_BLOCK = ("otel_llm.kv_block.lifetime", "otel_llm.kv_block.idle_before_evict", "otel_llm.kv_block.reuse_gap")


def set_scheduler(m: MetricsState, running: int, waiting: int, waiting_deferred: int, kv_usage: float) -> None:
    """The scheduler's gauges; `waiting` counts every waiting request, `waiting_deferred` those of
    them deferred by transient constraints (vLLM's "deferred" reason; the rest wait for capacity)."""
    g = m.gauges
    g["otel_llm.scheduler.running"] = running
    g["otel_llm.scheduler.waiting"] = waiting
    g["otel_llm.scheduler.waiting_by_reason"] = np.array((waiting - waiting_deferred, waiting_deferred), np.float64)
    g["otel_llm.kv_cache.usage"] = kv_usage


def clear_scheduler(m: MetricsState) -> None:
    """The engine is gone: nothing runs, waits or holds KV cache (gauges never set stay unset)."""
    g = m.gauges
    g["otel_llm.scheduler.running"] = g["otel_llm.scheduler.waiting"] = 0
    g["otel_llm.kv_cache.usage"] = 0.0
    if g["otel_llm.scheduler.waiting_by_reason"] is not None:
        g["otel_llm.scheduler.waiting_by_reason"] = np.zeros(2)


def add_prefix_cache(m: MetricsState, queries: int, hits: int, external_queries: int = 0,
                     external_hits: int = 0, external_by_tier: dict[str, int] | None = None) -> None:
    """Prefix-cache lookups and hits in tokens, this engine's and a KV connector's (external); the
    hits by the tier that supplied them (vLLM's `prompt_tokens_cached_by_source`): this engine's are
    `device`, a connector's those it names in `external_by_tier` (vLLM 0.32's `hits_by_source`; a
    tier outside vLLM's vocabulary is `external_unspecified`), or all `external_unspecified` when it
    names none (None)."""
    m.add("otel_llm.prefix_cache.queries", queries)
    m.add("otel_llm.prefix_cache.hits", hits)
    m.add("otel_llm.external_prefix_cache.queries", external_queries)
    m.add("otel_llm.external_prefix_cache.hits", external_hits)
    by_tier = m.counters["otel_llm.prefix_cache.hits_by_source"]
    by_tier[0] += hits
    if external_by_tier is None:
        by_tier[-1] += external_hits
    else:
        for tier, n in external_by_tier.items():
            by_tier[_TIERS.get(tier, -1)] += n


def add_spec_decoding(m: MetricsState, drafts: int, draft_tokens: int, accepted_tokens: int,
                      accepted_per_position: Iterable[Sequence[int]]) -> int:
    """Speculative decoding totals and, per step, accepted tokens by draft position. A step with
    more than MAX_SPEC_POSITIONS positions, or a negative count, leaves its per-position part out;
    returns how many steps did (the caller counts them dropped)."""
    m.add("otel_llm.spec_decode.drafts", drafts)
    m.add("otel_llm.spec_decode.draft_tokens", draft_tokens)
    m.add("otel_llm.spec_decode.accepted_tokens", accepted_tokens)
    out = m.counters["otel_llm.spec_decode.accepted_tokens_per_pos"]
    left_out = 0
    for pos in accepted_per_position:
        if len(pos) > MAX_SPEC_POSITIONS or (len(pos) and min(pos) < 0):
            left_out += 1
        elif len(pos):
            out[: len(pos)] += pos
    return left_out


def fold_kv_evictions(m: MetricsState, lifetimes, idle_before_evict, reuse_gaps) -> None:
    """Sampled KV block residency (vLLM's --kv-cache-metrics): float64 arrays in the state's unit for
    seconds (ns for the frontend's state, seconds for the vLLM plugin's)."""
    for name, values in zip(_KV_BLOCK, (lifetimes, idle_before_evict, reuse_gaps)):
        if len(values):
            m.histograms[name].fold(values)
