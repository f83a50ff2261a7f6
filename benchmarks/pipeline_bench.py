"""The two-stage pipeline (`otel-llm serve-pipeline`) with stats on against stats off, at saturation.

Each of `--repeats` rounds starts two serve-pipeline servers (tone talker): one with stats on
(stage-0 `vllm:*` families with stage/replica, the pipeline's `vllm_omni:*` families, every
request, hop and audio chunk recorded), one with `--disable-log-stats`, and runs the same load of
streamed audio chat requests (all at once, `--concurrency` in flight) against both, time-sliced
(`benchmarks/serving/time_slicing.py`: one server and its client run for `--slice` s while the
other is stopped, so machine-speed noise hits both alike; stamps are mapped to each server's
running time). Per round: output-token throughput on/off, and the mean end-to-end latency delta
(on - off) / off. Targets: throughput ratio >= 0.98, mean latency delta <= 1%.

Stage 0's model: `--model dummy` (default) runs its forward pass on the CPU, so the engine, the
API process, its talker threads and the load client share the machine's cores and every
microsecond of telemetry comes out of throughput. `--model null --null-step-ms MS` has the engine
take MS per step with the CPU free meanwhile, as with the forward pass on an accelerator (the
deployment vLLM-Omni measured); with `--concurrency` above `--max-num-seqs` the engine runs full
batches with a queue waiting.

Progress goes to stderr; one JSON object to stdout.

    python benchmarks/pipeline_bench.py --repeats 3 --num-requests 96 --concurrency 16 --max-tokens 32
    python benchmarks/pipeline_bench.py --model null --null-step-ms 10 --max-num-seqs 64 --concurrency 96
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.serving.server_process import ManagedServer  # noqa: E402 (after the path is set)
from benchmarks.serving.summary import median, median_ci90, ratio, server_cpu_medians  # noqa: E402
from benchmarks.serving.time_slicing import time_sliced  # noqa: E402
from benchmarks.serving.workload import poisson_workload  # noqa: E402

THROUGHPUT_TARGET = 0.98
LATENCY_DELTA_TARGET = 0.01


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-requests", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--slice", type=float, default=0.2, help="seconds each server runs in turn")
    p.add_argument("--load-timeout", type=float, default=300.0, help="seconds of running time per load, at most")
    p.add_argument("--talker-replicas", type=int, default=2)
    p.add_argument("--model", default="dummy", choices=("dummy", "null"),
                   help="stage 0's model: dummy (its forward pass on the CPU) or null (no forward pass)")
    p.add_argument("--null-step-ms", type=float, default=None, metavar="MS",
                   help="with --model null: every engine step takes at least MS, as an accelerator's would")
    p.add_argument("--max-num-seqs", type=int, default=None, help="the engine's batch limit (default: the server's)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.null_step_ms is not None and args.model != "null":
        p.error("--null-step-ms needs --model null")
    args.ignore_eos, args.audio, args.model_name = True, True, args.model  # what time_sliced reads
    return args


def run(args) -> dict:
    reqs = poisson_workload(args.num_requests, float("inf"), args.prompt_len, args.max_tokens, args.seed)
    rounds = []
    for r in range(args.repeats):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")  # each leads the slices in turn
        extra = ["--talker-replicas", str(args.talker_replicas)]
        if args.null_step_ms is not None:
            extra += ["--null-step-ms", str(args.null_step_ms)]
        servers = {mode: ManagedServer(args.model, mode == "on", None, args.max_num_seqs, extra,
                                       command="serve-pipeline")
                   for mode in order}
        try:
            for srv in servers.values():
                srv.wait_ready()
            rounds.append(time_sliced(servers, reqs, args, f"round {r + 1}", None))
        finally:
            for srv in servers.values():
                srv.stop()
    thr = [ratio(rd["on"]["output_token_throughput"], rd["off"]["output_token_throughput"]) for rd in rounds]
    lat = [ratio(rd["on"]["e2e_ms"]["mean"], rd["off"]["e2e_ms"]["mean"]) - 1 for rd in rounds]
    failed = sum(rd[m]["failed"] for rd in rounds for m in rd)
    counts_exact = all(rd["on"]["counts"] and all(c["exact"] for c in rd["on"]["counts"].values()) for rd in rounds)
    result = {
        "benchmark": "pipeline_stats_on_vs_off", "method": "time_sliced", "slice_s": args.slice,
        "model": args.model, "null_step_ms": args.null_step_ms, "max_num_seqs": args.max_num_seqs,
        "requests_per_round": args.num_requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
        "talker_replicas": args.talker_replicas, "repeats": args.repeats,
        "throughput_ratio_on_vs_off": median(thr), "throughput_ratio_ci90": median_ci90(thr),
        "mean_e2e_latency_delta_on_vs_off": median(lat), "mean_e2e_latency_delta_ci90": median_ci90(lat),
        "throughput_ratio_per_round": [round(x, 4) for x in thr],
        "mean_e2e_latency_delta_per_round": [round(x, 4) for x in lat],
        "tok_s_per_round": {m: [round(rd[m]["output_token_throughput"]) for rd in rounds] for m in ("off", "on")},
        "mean_e2e_ms_per_round": {m: [round(rd[m]["e2e_ms"]["mean"], 2) for rd in rounds] for m in ("off", "on")},
        "mean_ttfp_ms_per_round": {m: [round(rd[m]["ttft_ms"]["mean"], 2) for rd in rounds] for m in ("off", "on")},
        "server_cpu_us_per_token": server_cpu_medians(rounds, ("off", "on")),
        "failed_requests": failed, "counts_exact_every_round": counts_exact,
    }
    result["meets_targets"] = (result["throughput_ratio_on_vs_off"] >= THROUGHPUT_TARGET
                               and result["mean_e2e_latency_delta_on_vs_off"] <= LATENCY_DELTA_TARGET)
    result["valid"] = failed == 0 and counts_exact
    return result


def main(argv=None) -> int:
    print(json.dumps(run(parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
