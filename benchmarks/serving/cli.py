"""Online serving benchmark for the otel-llm server (OpenAI /v1/completions, streaming).

One asyncio loop, one task per request (no thread per stream), a minimal pooled
HTTP/1.1 + SSE client (`StreamClient`) so the client's own cost stays out of its timings.

Arrivals: Poisson at each of ``--rates`` (req/s, ``inf`` = all at once), or replayed
from ``--trace file.jsonl`` (lines ``{"timestamp": s, "prompt": str | "prompt_len": int,
"max_tokens": int}``; ``--time-scale`` multiplies the inter-arrival gaps).
``--concurrency`` caps requests in flight (a semaphore; the clock starts on send).

Per request (client side): TTFT (send -> first token chunk: one with choices, as vLLM's
benchmark counts, even when its text is "" because the token ends inside a character), ITL
(gaps between token chunks), TPOT ((e2e - ttft) / (tokens - 1)), E2E (send -> end of stream); tokens come
from the usage chunk (``stream_options.include_usage``). Reported: mean/p50/p90/p99 of
each, request throughput, output token throughput, wall time.

Server: ``--url`` for a running one, or ``--start-server`` to launch
``python -m otel_llm serve --model dummy`` on a free port (telemetry fully on: metrics + OTLP
traces to a local OtlpReceiver in its own process, OTEL_TRACES_SAMPLER=always_on).

``--compare-telemetry`` (at saturation: ``--rates inf``): every one of ``--repeats`` rounds
starts a server with telemetry fully on, one fully off (--disable-log-stats, no tracing) and,
with ``--aa-control``, a second one fully off, and runs the same load against all of them
*time-sliced*: one server and its load client (a process of its own) run for ``--slice``
seconds while the others are stopped with SIGSTOP, in turn, until every load is done. A
shared 2-vCPU VM changes speed by +-20% from one second to the next (measured: the engine
alone), so loads run one after the other compare different machines; slices of 0.2 s make
that noise hit every server alike. Client stamps are mapped to their server's running time,
so throughput and latencies are those of a server that had the machine to itself. The OTLP
receiver runs only in the telemetry-on server's slices (its CPU is charged to telemetry).
Reported: median over rounds of the on/off throughput and p99 ITL ratios, and of the
control/off ratios (what two identical servers measure: the resolution of the method).

Server CPU (servers this script started): user + system CPU seconds of the API and engine
processes during each measured load, per generated token: which process telemetry costs
CPU in.

Fidelity (``--start-server`` or ``--url`` runs whose server exposes vllm: metrics): /metrics
is scraped before and after the load; request / generation-token / prompt-token deltas are
compared exactly with the client's counts, server mean TTFT and E2E with the client's
(``within_tolerance``: |diff| <= max(5% of client mean, 2 ms)). ``--compare-telemetry``
checks the counts only (a stopped server's clock runs on).

Progress goes to stderr; one JSON object goes to stdout (and to ``--out`` if given).
``--plot DIR`` also draws it (`benchmarks/serving/plots.py`).

    python benchmarks/serve_bench.py --compare-telemetry --aa-control --num-requests 384 --ignore-eos --repeats 8
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import time
from pathlib import Path

import httpx

from benchmarks.serving import log
from benchmarks.serving.client import StreamClient
from benchmarks.serving.fidelity import fidelity, scrape
from benchmarks.serving.server_process import ManagedServer, cpu_per_token, cpu_seconds, get_model
from benchmarks.serving.span_receiver import ReceiverProcess, wait_spans
from benchmarks.serving.plots import write_plots
from benchmarks.serving.summary import run_load, take_samples
from benchmarks.serving.telemetry_comparison import compare_telemetry
from benchmarks.serving.workload import Req, make_prompt, workloads


async def _bench(url: str, args, label: str, want_fidelity: bool, pids: dict[str, int]) -> list[dict]:
    model = get_model(url, args.model_name)
    out = []
    # One client for warm-up and all loads: the warm-up opens the pooled connections,
    # so measured TTFTs do not include TCP connects. httpx only for the /metrics scrapes,
    # blocking: they run between loads, when nothing else is in flight.
    client = StreamClient(url)
    with httpx.Client(timeout=30.0) as scraper:
        for name, reqs in workloads(args):
            n_warm = min(args.concurrency, len(reqs)) if args.warmup is None else args.warmup
            if n_warm:
                warm = [Req(0.0, make_prompt(args.prompt_len, 10_000 + i), args.max_tokens) for i in range(n_warm)]
                await run_load(client, model, warm, args.concurrency, args.ignore_eos, f"{label} warmup")
            before = scrape(scraper, url) if want_fidelity else None
            log(f"{label}: {name}, {len(reqs)} requests, concurrency {args.concurrency}")
            cpu_before = cpu_seconds(pids)
            load = await run_load(client, model, reqs, args.concurrency, args.ignore_eos, f"{label} {name}")
            load["server_cpu"] = cpu_per_token(cpu_before, cpu_seconds(pids), load)
            after = scrape(scraper, url) if want_fidelity else None
            ttft, e2e = load["ttft_ms"], load["e2e_ms"]
            fid = fidelity(before, after, load, ttft and ttft["mean"] / 1e3, e2e and e2e["mean"] / 1e3)
            log(f"{label} {name}: {load['completed']}/{load['requests']} ok, "
                f"{load['output_token_throughput']:.1f} tok/s, wall {load['wall_s']:.2f}s")
            out.append({"workload": name, **load, "fidelity": fid})
    await client.aclose()
    return out


def bench_against(url: str, args, label: str, want_fidelity: bool, pids: dict[str, int] | None = None) -> list[dict]:
    """`pids`: the server's processes ({"api": pid, "engine": pid}) when this script started them."""
    try:  # uvloop's cheaper loop keeps the client's own delay in reading chunks out of its timings
        from uvloop import run
    except ImportError:
        run = asyncio.run
    return run(_bench(url, args, label, want_fidelity, pids or {}))


def parse_rate(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"rate must be > 0 or inf, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--url", default=None, help="benchmark a running server (e.g. http://127.0.0.1:8000)")
    src.add_argument("--start-server", action="store_true", help="launch python -m otel_llm serve on a free port")
    p.add_argument("--compare-telemetry", action="store_true",
                   help="(with --start-server) run the load with telemetry fully on and fully off")
    p.add_argument("--server-model", default="dummy", help="--model for a started server")
    p.add_argument("--model-name", default=None, help="model name in requests (default: first of /v1/models)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="forwarded to a started server")
    p.add_argument("--server-arg", action="append", default=[], help="extra arg for a started server (repeatable)")
    p.add_argument("--rates", type=parse_rate, nargs="+", default=[float("inf")], help="Poisson req/s; inf = all at once")
    p.add_argument("--trace", default=None, help="JSONL trace: timestamp, prompt|prompt_len, max_tokens")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies trace inter-arrival gaps")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--ignore-eos", action="store_true", help='send "ignore_eos": true')
    p.add_argument("--concurrency", type=int, default=64, help="max requests in flight")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up requests before each measured load (default: min(concurrency, num requests))")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-traces", action="store_true",
                   help="--compare-telemetry with metrics only on the telemetry-on server (separates their costs)")
    p.add_argument("--repeats", type=int, default=3, help="--compare-telemetry rounds (fresh servers each, time-sliced)")
    p.add_argument("--aa-control", action="store_true",
                   help="--compare-telemetry with a second telemetry-off server each round: the noise floor")
    p.add_argument("--slice", type=float, default=0.2,
                   help="--compare-telemetry: seconds each server runs before the next one's turn")
    p.add_argument("--load-timeout", type=float, default=600.0,
                   help="--compare-telemetry: seconds of running time a server's load may take before the run fails")
    p.add_argument("--span-wait", type=float, default=12.0, help="max seconds to wait for spans to arrive")
    p.add_argument("--quick", action="store_true",
                   help="dummy model, 128 requests, max_tokens 64, rate inf, concurrency 64, ignore_eos")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--plot", default=None, metavar="DIR",
                   help="draw latency CDFs, throughput against offered rate and (--compare-telemetry) the on/off "
                        "rounds as PNG files in DIR, with the data drawn in DIR/plots.json (needs matplotlib)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.server_model, args.num_requests, args.max_tokens = "dummy", 128, 64
        args.rates, args.concurrency, args.ignore_eos, args.prompt_len = [float("inf")], 64, True, 64
    if args.compare_telemetry and not args.start_server:
        if args.url:
            raise SystemExit("serve_bench: error: --compare-telemetry needs --start-server (it restarts the server)")
        args.start_server = True
    if args.compare_telemetry and (args.trace or any(not math.isinf(r) for r in args.rates)):
        raise SystemExit("serve_bench: error: --compare-telemetry measures at saturation (--rates inf, no --trace): "
                         "time slicing would compress arrival gaps")
    if not args.slice > 0:
        raise SystemExit(f"serve_bench: error: --slice must be > 0, got {args.slice}")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # fail now, not after the load
        raise SystemExit("serve_bench: error: --plot needs matplotlib: pip install 'otel-llm[timeline]'")
    if not args.url and not args.start_server:
        args.url = "http://127.0.0.1:8000"
    config = {k: (v if not isinstance(v, list) else [str(x) for x in v]) for k, v in vars(args).items()}
    t0 = time.perf_counter()
    if args.compare_telemetry:
        report = {"mode": "compare_telemetry", **compare_telemetry(args)}
    elif args.start_server:
        with ReceiverProcess() as rx:
            srv = ManagedServer(args.server_model, True, f"{rx.endpoint}/v1/traces", args.max_num_seqs, args.server_arg)
            try:
                srv.wait_ready()
                runs = bench_against(srv.url, args, "telemetry-on", want_fidelity=True, pids=srv.pids)
            finally:
                srv.stop()
            report = {"mode": "start_server", "runs": runs, "spans_received": wait_spans(rx, 3.0, 0.5)}
    else:
        report = {"mode": "url", "url": args.url, "runs": bench_against(args.url, args, "url", want_fidelity=True)}
    report["total_wall_s"] = time.perf_counter() - t0
    report["config"] = config
    samples = take_samples(report)
    if args.plot:
        for path in write_plots(report, samples, args.plot):
            log(f"wrote {path}")
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0
