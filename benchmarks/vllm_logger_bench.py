"""vLLM's own PrometheusStatLogger against otel-llm's plugin, on the same real vLLM stats objects.

Run in the vLLM venv (see tests/vllm/harness.py): `.venv-vllm/bin/python benchmarks/vllm_logger_bench.py`.
Prints one JSON object. Every case builds fresh `IterationStats`/`SchedulerStats`/
`FinishedRequestStats` per step (as vLLM does) and times, in alternating rounds,
the CPU each logger spends on them, ours including the deferred folding (so
nothing is hidden off the measured path):

- steady decode at 64 and 256 requests in flight: ns per generated token (each step's ITLs one
  timestamp difference, as vLLM computes them; `jitter_256`: every request's ITL its own, the worst case);
- steps where many requests finish (64 per step) and where one finishes per step with 64 in flight:
  µs per finished request (the steps' whole cost over the requests finished);
- `/metrics` render of the logger's families after 10,000 finished requests;
- `add` mode: vLLM's logger plus ours, over vLLM's alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")  # measure recording, not the network
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM logs to stdout; stdout is the JSON alone
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def vllm_config(model_dir: str):
    from vllm.engine.arg_utils import EngineArgs
    return EngineArgs(model=model_dir, max_model_len=1024, enforce_eager=True, dtype="bfloat16").create_engine_config()


FINISHING = {"decode": lambda n: 0, "jitter": lambda n: 0, "many": lambda n: n, "one": lambda n: 1}


def make_steps(kind: str, n_steps: int, in_flight: int, seed: int = 0):
    """Fresh vLLM stats objects per step: (SchedulerStats, IterationStats, tokens, finished)."""
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerStats

    rng = random.Random(seed)
    out = []
    now = 1000.0
    for _ in range(n_steps):
        it = IterationStats()
        finishing = FINISHING[kind](in_flight)
        it.num_generation_tokens = in_flight
        # vLLM: ITL = this step's engine timestamp - the request's last token's, i.e. the previous step's
        # for every request that was in it; "jitter" draws each request's own (the worst case for us).
        previous, now = now, now + rng.uniform(0.004, 0.03)
        it.inter_token_latencies_iter = ([rng.uniform(0.004, 0.03) for _ in range(in_flight)] if kind == "jitter"
                                         else [now - previous for _ in range(in_flight)])
        for _ in range(finishing):
            it.finished_requests.append(FinishedRequestStats(
                finish_reason=FinishReason(rng.choice((0, 1))), request_id="r", e2e_latency=rng.uniform(0.5, 9),
                num_prompt_tokens=rng.randint(10, 900), num_preemptions=0, num_generation_tokens=rng.randint(1, 500),
                max_tokens_param=512, queued_time=rng.uniform(0, 0.1), prefill_time=rng.uniform(0.01, 0.2),
                inference_time=rng.uniform(0.5, 8), decode_time=rng.uniform(0.4, 8),
                mean_time_per_output_token=rng.uniform(0.005, 0.03), num_cached_tokens=rng.randint(0, 64)))
            it.max_num_generation_tokens_iter.append(rng.randint(1, 500))
            it.n_params_iter.append(1)
        sched = SchedulerStats(num_running_reqs=in_flight, num_waiting_reqs=0, kv_cache_usage=0.4,
                               prefix_cache_stats=PrefixCacheStats(requests=finishing, queries=16 * finishing,
                                                                   hits=8 * finishing))
        out.append((sched, it, in_flight, finishing))
    return out


def cpu_ns(fn) -> int:
    gc.collect()  # no collection pending from the previous run is charged to this one
    t = time.process_time_ns()
    fn()
    return time.process_time_ns() - t


def run_case(loggers: dict, kind: str, in_flight: int, n_steps: int, rounds: int) -> dict:
    results = {name: [] for name in loggers}
    for r in range(rounds):
        order = list(loggers.items())
        if r % 2:
            order.reverse()  # alternate who goes first
        for name, (record, settle) in order:
            steps = make_steps(kind, n_steps, in_flight, seed=r)

            def go():
                for sched, it, _, _ in steps:
                    record(sched, it)
                settle()
            results[name].append(cpu_ns(go))
    tokens = n_steps * in_flight
    finished = n_steps * FINISHING[kind](in_flight)
    out = {}
    for name, ns in results.items():
        ns.sort()
        entry = {"ns_per_token_min": ns[0] / tokens, "ns_per_token_median": statistics.median(ns) / tokens}
        if finished:
            entry.update(us_per_finished_min=ns[0] / finished / 1e3,
                         us_per_finished_median=statistics.median(ns) / finished / 1e3)
        out[name] = entry
    return out


def same_samples(theirs: str, ours: str) -> bool:
    """Both expositions hold the same samples with equal values (sums to float rounding)."""
    from prometheus_client.parser import text_string_to_metric_families

    def samples(text):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples if not s.name.endswith("_created")}
    a, b = samples(theirs), samples(ours)
    bad = [k for k in a.keys() | b.keys() if k not in a or k not in b or not math.isclose(a[k], b[k], rel_tol=1e-9)]
    for k in bad[:5]:
        print(f"differs: {k}: vllm {a.get(k)} otel_llm {b.get(k)}", file=sys.stderr)
    return not bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=str(REPO / ".cache/vllm-tiny-llama"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    from prometheus_client import REGISTRY
    from prometheus_client.exposition import generate_latest

    from otel_llm.vllm.plugin import OtelLLMPrometheusStatLogger, OtelLLMStatLogger
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    cfg = vllm_config(args.model_dir)
    ours = OtelLLMPrometheusStatLogger(cfg, [0])  # first: vLLM's __init__ unregisters earlier vllm: collectors
    add = OtelLLMStatLogger(cfg, [0])
    theirs_beside_add = PrometheusStatLogger(cfg, [0])  # add mode's own vLLM logger: `theirs` sees only its case's steps
    theirs = PrometheusStatLogger(cfg, [0])  # last: the one left registered, rendered and compared with ours

    def rec(lg):
        return lambda s, i: lg.record(scheduler_stats=s, iteration_stats=i, mm_cache_stats=None, engine_idx=0)

    from vllm.utils.gc_utils import freeze_gc_heap
    freeze_gc_heap()  # as vLLM's API server does after start-up: a full collection then skips the import-time heap

    loggers = {
        "vllm": (rec(theirs), lambda: None),
        "otel_llm_replace": (rec(ours), ours._otel.agg.settle),
        "vllm_plus_otel_llm_add": (lambda s, i: (theirs_beside_add.record(scheduler_stats=s, iteration_stats=i,
                                                               mm_cache_stats=None, engine_idx=0),
                                                  add.record(scheduler_stats=s, iteration_stats=i,
                                                             mm_cache_stats=None, engine_idx=0)),
                                   add._otel.agg.settle),
    }
    report = {"steps_per_round": args.steps, "rounds": args.rounds, "cases": {}}
    for kind, in_flight in (("decode", 64), ("decode", 256), ("jitter", 256), ("many", 64), ("one", 64)):
        report["cases"][f"{kind}_{in_flight}"] = run_case(loggers, kind, in_flight, args.steps, args.rounds)
        print(f"case {kind}_{in_flight} done", file=sys.stderr)

    # /metrics after 10,000 finished requests (both loggers have seen every case above too).
    for sched, it, _, _ in make_steps("many", 10_000 // 64 + 1, 64, seed=99):
        theirs.record(sched, it, None, 0)
        ours.record(sched, it, None, 0)

    class VllmOnly:
        def collect(self):
            for c in list(REGISTRY._collector_to_names):
                if getattr(c, "_name", "").startswith("vllm:"):
                    yield from c.collect()

    render = {"vllm": [], "otel_llm_replace": []}
    for _ in range(args.rounds * 3):
        render["vllm"].append(cpu_ns(lambda: generate_latest(VllmOnly())))
        render["otel_llm_replace"].append(cpu_ns(ours.render))
    report["same_samples_as_vllm"] = same_samples(generate_latest(VllmOnly()).decode(), ours.render().decode())
    report["metrics_render_ms"] = {k: {"min": min(v) / 1e6, "median": statistics.median(v) / 1e6}
                                   for k, v in render.items()}
    c = report["cases"]

    def ratio(case, key):
        return c[case]["vllm"][key] / c[case]["otel_llm_replace"][key]
    report["ratios_vllm_over_replace"] = {
        "per_token_decode_64": ratio("decode_64", "ns_per_token_median"),
        "per_token_decode_256": ratio("decode_256", "ns_per_token_median"),
        "per_token_decode_256_jittered_itl": ratio("jitter_256", "ns_per_token_median"),
        "per_finished_many_64": ratio("many_64", "us_per_finished_median"),
        "per_finished_one_per_step_64": ratio("one_64", "us_per_finished_median"),
        "metrics_render": report["metrics_render_ms"]["vllm"]["median"]
        / report["metrics_render_ms"]["otel_llm_replace"]["median"],
    }
    report["add_mode_overhead"] = {
        case: c[case]["vllm_plus_otel_llm_add"]["ns_per_token_median"] / c[case]["vllm"]["ns_per_token_median"] - 1
        for case in c}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
