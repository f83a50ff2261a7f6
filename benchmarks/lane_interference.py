"""Prefill-decode interference, seen through the engine lane: long prompts arriving into steady decode.

A collector with a trace store and `otel-llm serve --model dummy` (chunked prefill: at most
`--max-num-batched-tokens` 256 tokens per step) start; `--streams` requests decode steadily (streamed,
`ignore_eos`, long outputs); after `--quiet-s` seconds `--long` requests of `--long-tokens` prompt
tokens each arrive (one output token each), then the streams run on to their end. The client times
every token of the steady streams.

Reported (one JSON object):
- `itl_ms`: the steady streams' inter-token latencies while the long prompts were being computed and
  outside that time (p50, p90, p99, count): the interference as a client sees it;
- `spans`: what the steady requests' spans say (`otel_llm.engine.interfering_prefill_tokens`, min and
  max over them; the long prompts' tokens are what they should come to) and how many steps they ran in;
- `lane`: the engine lane's steps over the run as `/api/llm/timeline` has them: how many, how many
  computed prompt tokens, and the longest steps with and without prompt tokens;
- `screenshot`: with `--screenshot PATH` (and Debian's chromium), the `/ui` view of the most-slowed
  steady request, its steps and the prefills that slowed it (the picture in docs/timelines.md).

Usage: python benchmarks/lane_interference.py [--screenshot docs/images/engine-lane.png]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.serving.server_process import ManagedServer  # noqa: E402 (after the path is set)
from otel_llm.collector.service import Collector, CollectorConfig  # noqa: E402
from otel_llm.collector.tracestore.store import TraceStoreConfig  # noqa: E402


def log(msg: str) -> None:
    print(f"[lane_interference {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def stream(url: str, i: int, max_tokens: int, stamps: list) -> None:
    """One steady decode: the monotonic time of every token chunk, appended to `stamps`."""
    body = {"model": "dummy", "prompt": f"steady stream {i}", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True}
    times = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                times.append(time.monotonic())
    stamps.append(times)


def long_prompt(url: str, i: int, tokens: int, span: list) -> None:
    t0 = time.monotonic()
    prompt = "".join(chr(97 + (i + k) % 26) for k in range(tokens))  # the dummy tokenizer: one token per byte
    httpx.post(f"{url}/v1/completions", json={"model": "dummy", "prompt": prompt, "max_tokens": 1}, timeout=300)
    span.append((t0, time.monotonic()))


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"count": len(values), "p50": round(q[49], 3), "p90": round(q[89], 3), "p99": round(q[98], 3)}


def screenshot(api: str, window: str, trace_id: str, path: str) -> str | None:
    chromium = shutil.which("chromium")
    if chromium is None:
        return None
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        f"--user-data-dir={profile}", "--window-size=1400,2200", "--virtual-time-budget=10000",
                        f"--screenshot={path}", f"{api}/ui#{window}&trace={trace_id}"],
                       capture_output=True, timeout=120, check=True)
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=12)
    ap.add_argument("--stream-tokens", type=int, default=1000)
    ap.add_argument("--long", type=int, default=4)
    ap.add_argument("--long-tokens", type=int, default=1500)
    ap.add_argument("--quiet-s", type=float, default=0.5)
    ap.add_argument("--screenshot", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as traces, Collector(CollectorConfig(
            otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, jaeger_port=0,
            trace_store=TraceStoreConfig(traces))) as collector:
        server = ManagedServer("dummy", True, f"{collector.http.endpoint}/v1/traces", 64,
                               ["--max-num-batched-tokens", "256", "--max-model-len", "2048"])
        try:
            server.wait_ready()
            start_us = time.time_ns() // 1000
            stamps: list = []
            prefills: list = []
            threads = [threading.Thread(target=stream, args=(server.url, i, args.stream_tokens, stamps))
                       for i in range(args.streams)]
            for t in threads:
                t.start()
            time.sleep(args.quiet_s)
            log(f"{args.long} prompts of {args.long_tokens} tokens arrive into {args.streams} steady decodes")
            longs = [threading.Thread(target=long_prompt, args=(server.url, i, args.long_tokens, prefills))
                     for i in range(args.long)]
            for t in longs:
                t.start()
            for t in longs + threads:
                t.join()
        finally:
            server.stop()
        end_us = time.time_ns() // 1000 + 1_000_000
        window = f"start={start_us}&end={end_us}"
        api = collector.jaeger.url
        busy = (min(a for a, _ in prefills), max(b for _, b in prefills))
        during, quiet = [], []
        for times in stamps:
            for a, b in zip(times, times[1:]):
                (during if busy[0] <= b <= busy[1] else quiet).append((b - a) * 1e3)
        time.sleep(1.0)  # the last spans reach the store
        data = httpx.get(f"{api}/api/llm/timeline?{window}", timeout=30).json()["data"]
        steady = [r for r in data["rows"] if r["decode"] and int(r["decode"][1]) - int(r["decode"][0]) > 1e8]
        tags = {}
        for row in steady:
            (trace,) = httpx.get(f"{api}/api/traces/{row['trace_id']}", timeout=30).json()["data"]
            span = next(s for s in trace["spans"] if s["spanID"] == row["span_id"])
            tags[row["trace_id"]] = {t["key"]: t["value"] for t in span["tags"]}
        interfering = [t.get("otel_llm.engine.interfering_prefill_tokens", 0) for t in tags.values()]
        lane = data["lanes"][0] if data["lanes"] else None
        report = {
            "itl_ms": {"during_long_prefills": percentiles(during), "otherwise": percentiles(quiet)},
            "spans": {"steady_requests": len(tags), "long_prompt_tokens": args.long * args.long_tokens,
                      "interfering_prefill_tokens": {"min": min(interfering, default=0),
                                                     "max": max(interfering, default=0)},
                      "steps": [t.get("otel_llm.engine.steps") for t in tags.values()][:3]},
        }
        if lane is not None:
            durations = [(e - s) / 1e3 for s, e in zip(lane["start_us"], lane["end_us"])]
            prefill = [d for d, p in zip(durations, lane["prefill_tokens"]) if p > 0]
            decode = [d for d, p in zip(durations, lane["prefill_tokens"]) if p == 0]
            report["lane"] = {"steps": len(durations), "steps_with_prompt_tokens": len(prefill),
                              "step_ms_with_prompt_tokens": percentiles(prefill),
                              "step_ms_decode_only": percentiles(decode)}
        if args.screenshot and tags:
            victim = max(tags, key=lambda t: tags[t].get("otel_llm.engine.interfering_prefill_tokens", 0))
            report["screenshot"] = screenshot(api, window, victim, args.screenshot)
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
