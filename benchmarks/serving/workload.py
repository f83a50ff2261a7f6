"""The load: requests (prompt, max_tokens, arrival offset) from a Poisson process or a JSONL trace."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np


@dataclass
class Req:
    arrival_s: float  # offset from the start of the run
    prompt: str
    max_tokens: int


def make_prompt(n: int, seed: int) -> str:
    # Varied printable characters; the dummy tokenizer is byte-level, so ~n tokens.
    alphabet = "abcdefghijklmnopqrstuvwxyz "
    return "".join(alphabet[(seed * 7919 + i * 31) % len(alphabet)] for i in range(max(1, n)))


def poisson_workload(n: int, rate: float, prompt_len: int, max_tokens: int, seed: int) -> list[Req]:
    rng = np.random.default_rng(seed)
    if math.isinf(rate):
        arrivals = np.zeros(n)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
        arrivals -= arrivals[0]
    return [Req(float(a), make_prompt(prompt_len, i), max_tokens) for i, a in enumerate(arrivals)]


def trace_workload(path: str, time_scale: float, default_prompt_len: int, default_max_tokens: int,
                   limit: int | None) -> list[Req]:
    rows = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    if limit:
        rows = rows[:limit]
    if not rows:
        raise SystemExit(f"serve_bench: error: trace {path!r} has no requests")
    ts = [float(r.get("timestamp", 0.0)) for r in rows]
    t0 = ts[0]
    reqs, prev_ts, prev_arr = [], t0, 0.0
    for i, (r, t) in enumerate(zip(rows, ts)):
        arr = prev_arr + max(0.0, t - prev_ts) * time_scale
        prev_ts, prev_arr = t, arr
        prompt = r["prompt"] if "prompt" in r else make_prompt(int(r.get("prompt_len", default_prompt_len)), i)
        reqs.append(Req(arr, prompt, int(r.get("max_tokens", default_max_tokens))))
    return reqs


def workloads(args) -> list[tuple[str, list[Req]]]:
    if args.trace:
        return [(f"trace x{args.time_scale}",
                 trace_workload(args.trace, args.time_scale, args.prompt_len, args.max_tokens, args.num_requests))]
    return [(f"rate={r}", poisson_workload(args.num_requests, r, args.prompt_len, args.max_tokens, args.seed))
            for r in args.rates]
