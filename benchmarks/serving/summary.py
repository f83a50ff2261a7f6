"""Client-side figures of a load (throughput, TTFT/ITL/TPOT/e2e percentiles) and of rounds (medians,
bootstrap intervals, ratios)."""

from __future__ import annotations

import numpy as np

from benchmarks.serving.client import Result, StreamClient, run_requests
from benchmarks.serving.workload import Req

SAMPLES = "samples_ms"


def stats(values, scale: float = 1000.0) -> dict | None:
    a = np.asarray(values, dtype=float) * scale
    if not a.size:
        return None
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "n": int(a.size)}


def summarize(results: list[Result], start: float, end: float, clock=None) -> dict:
    """Client-side figures of one load. `clock` maps perf_counter stamps to the time the
    server was running (see `time_sliced`); identity by default."""
    clock = clock or np.asarray
    ok = [r for r in results if r.ok and r.times]
    errors = [r.error or "no token chunk" for r in results if not (r.ok and r.times)]
    t0, t1 = clock([start, end])
    wall = float(t1 - t0)
    out_tokens = sum(r.completion_tokens for r in ok)
    ttft, itl, e2e, tpot = [], [], [], []
    for r in ok:
        send, end_r = clock([r.t_send, r.t_end])
        times = clock(r.times)
        ttft.append(times[0] - send)
        itl.append(np.diff(times))
        e2e.append(end_r - send)
        if r.completion_tokens > 1:
            tpot.append((end_r - times[0]) / (r.completion_tokens - 1))
    chunks = sum(len(r.times) for r in ok)
    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(errors),
        "errors": errors[:5],
        "wall_s": wall,
        "request_throughput": len(ok) / wall if wall > 0 else None,
        "output_token_throughput": out_tokens / wall if wall > 0 else None,
        "total_prompt_tokens": sum(r.prompt_tokens for r in ok),
        "total_completion_tokens": out_tokens,
        "chunks": chunks,
        "mean_tokens_per_chunk": out_tokens / max(1, chunks),
        "ttft_ms": stats(ttft),
        "itl_ms": stats(np.concatenate(itl) if itl else []),
        "tpot_ms": stats(tpot),
        "e2e_ms": stats(e2e),
        # every value, for --plot (the CLI takes them out of the report: `take_samples`)
        SAMPLES: {"ttft": _ms(ttft), "itl": _ms(np.concatenate(itl) if itl else []), "e2e": _ms(e2e)},
    }


def _ms(values) -> list[float]:
    return [round(float(v) * 1e3, 4) for v in values]


def take_samples(report: dict) -> dict[str, dict[str, list[float]]]:
    """Removes the per-request samples from every load of `report` (its "runs", or its "rounds"
    of {mode: load}); returns them by load label ("rate=10", "on", ...), rounds pooled."""
    out: dict[str, dict[str, list[float]]] = {}
    loads = [(run["workload"], run) for run in report.get("runs", [])]
    loads += [(mode, load) for rnd in report.get("rounds", []) for mode, load in rnd.items()]
    for label, load in loads:
        pooled = out.setdefault(label, {"ttft": [], "itl": [], "e2e": []})
        for key, values in load.pop(SAMPLES).items():
            pooled[key].extend(values)
    return out


async def run_load(client: StreamClient, model: str, reqs: list[Req], concurrency: int,
                   ignore_eos: bool, label: str) -> dict:
    return summarize(*await run_requests(client, model, reqs, concurrency, ignore_eos, label))


def ratio(a, b):
    return a / b if a is not None and b else None


def median_ci90(values: list) -> list[float] | None:
    """A 90% bootstrap interval of the median of per-round ratios (rounds resampled)."""
    values = np.array([v for v in values if v is not None])
    if values.size < 2:
        return None
    medians = np.median(np.random.default_rng(0).choice(values, (10_000, values.size)), axis=1)
    return [round(float(x), 4) for x in np.percentile(medians, [5, 95])]


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def server_cpu_medians(rounds: list[dict], modes) -> dict:
    """Per server process: the median over rounds of its CPU per token in each mode, on/off, and per chunk."""
    cpu = {}
    for proc in ("api", "engine"):
        def med(key: str) -> dict:
            return {m: median([rd[m]["server_cpu"].get(proc, {}).get(key) for rd in rounds]) for m in modes}
        per_token = med("us_per_token")
        cpu[proc] = {**per_token, "ratio_on_vs_off": ratio(per_token["on"], per_token["off"]),
                     "us_per_chunk": med("us_per_chunk")}
    return cpu
