"""A request's timings, as a response tells its client (`otel-llm serve --return-timings`): the
`timings` object, defined here once.

| field | meaning |
|---|---|
| `queue` | s, waiting for the engine: first scheduled - queued (engine clock) |
| `prefill` | s, first scheduled - first token (engine clock) |
| `ttft` | s, time to first token: the server had the request - it handed out the first token |
| `decode` | s, first token - last token (engine clock) |
| `tpot` | s, time per output token after the first: decode / (completion tokens - 1), the mean inter-token latency |
| `e2e` | s, the server had the request - it handed out the last token |
| `prompt_tokens`, `cached_prompt_tokens`, `completion_tokens` | tokens: the prompt, its part found in the KV caches, generated |
| `steps` | engine steps that produced its tokens (one per output step) |
| `preemptions` | times the engine preempted it |

The intervals are the ones of its metrics and spans (vLLM v1's definitions, `request_table`); one the
request does not have (no first token; engine timestamps out of order; a single token for `tpot`)
is null. Seconds are rounded to the microsecond.
"""

from __future__ import annotations

_S_PER_NS = 1e-9


def _s(ns: int) -> float:
    return round(ns * _S_PER_NS, 6)


def engine_ordered(queued, sched, first, last):
    """Whether engine timestamps (ints, or numpy arrays element-wise) are complete and ordered: what a
    request's queue, prefill and decode intervals need."""
    return (first > 0) & (queued > 0) & (sched >= queued) & (first >= sched) & (last >= first)


def request_timings(arrival: int, first_recv: int, fin_recv: int, queued: int, sched: int, first: int, last: int,
                    prompt: int, cached: int, generated: int, steps: int, preemptions: int) -> dict:
    """The `timings` object from a request's timestamps (ns; 0: none; frontend clock for arrival,
    first_recv and fin_recv, engine clock for the others) and counts."""
    engine = engine_ordered(queued, sched, first, last)
    return {
        "queue": _s(sched - queued) if engine else None,
        "prefill": _s(first - sched) if engine else None,
        "ttft": _s(first_recv - arrival) if first_recv > 0 else None,
        "decode": _s(last - first) if engine else None,
        "tpot": _s((last - first) // (generated - 1)) if engine and generated > 1 else None,
        "e2e": _s(fin_recv - arrival),
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "completion_tokens": generated,
        "steps": steps,
        "preemptions": preemptions,
    }
