"""The fleet overview at fleet size: the latency heatmap of an hour of a 200,000-request trace store.

Fills a store in a temporary directory with ``--requests`` request trees as otel_llm emits them (5
spans each, `trace_store_bench.request_tree`: log-normal TTFT, ~2 % aborted, ~0.5 % errored) over the
last hour from two services, in batches of 100 requests. Then asks the collector's HTTP endpoint
(``/api/llm/heatmap``, as the web view does) for the last hour's overview of each metric (TTFT,
e2e, queue, ITL), every service and one, and reports median and p99 ms and the answer's bytes
(targets: <= 300 ms, <= 200 KB); then the drill-down (``/api/llm/timeline`` of a region: the hour's
and the last 5 minutes' requests with TTFT >= 0.2 s, 200 rows; target <= 200 ms), the hour without a
region (1,000 rows, chosen as the failed, the slowest and a sample), and BubbleUp of those regions
(``/api/llm/bubbleup``); the web view's first paint of the hour's overview in headless Chromium (from
navigating to ``/ui`` until the heatmap is drawn, the page's own clock; target <= 1.5 s; skipped without
``chromium``); and how long opening a store written before the overview existed takes (its stored
requests are counted once, at open).

Usage: python benchmarks/fleet_overview_bench.py [--requests 200000] [--quick]   (prints one JSON object)
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_store_bench import _export, request_tree, timed  # noqa: E402

from otel_llm.collector.extension.jaeger_query import JaegerQueryApi  # noqa: E402
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig  # noqa: E402

SERVICES = ("vllm-a", "vllm-b")
BATCH = 100


def fill(store: TraceStore, num_requests: int, rng: random.Random) -> dict:
    now_ns = time.time_ns()
    starts = sorted(now_ns - int(rng.uniform(0, 3600) * 1e9) for _ in range(num_requests))
    spans, t0, add_s = 0, time.perf_counter(), 0.0
    for i in range(0, num_requests, BATCH):
        body = _export(SERVICES[(i // BATCH) % 2], [s for _, tree, _ in
                                                     (request_tree(rng, s) for s in starts[i:i + BATCH]) for s in tree])
        t = time.perf_counter()
        spans += store.add(body)
        add_s += time.perf_counter() - t
        if (i // BATCH) % 200 == 0:
            print(f"filled {i}/{num_requests} requests", file=sys.stderr, flush=True)
    return {"spans": spans, "spans_per_s": round(spans / add_s), "fill_s": round(time.perf_counter() - t0, 1),
            "now_us": now_ns // 1000}


def first_paint_ms(url: str) -> float | None:
    """Milliseconds from navigating headless Chromium to `url` until the page has drawn the overview
    (`document.body.dataset.overviewMs`, the page's own performance.now() then); None without chromium."""
    chromium = shutil.which("chromium")
    if chromium is None:
        return None
    from websockets.sync.client import connect

    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                 f"--user-data-dir={profile}", "--window-size=1400,900", "--remote-debugging-port=0",
                                 "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.time() + 30
            while not (port_file.exists() and len(port_file.read_text().split()) == 2) and time.time() < deadline:
                time.sleep(0.1)
            port = port_file.read_text().split()[0]
            pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list").read())
            with connect(next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page"), max_size=None) as ws:
                ids = iter(range(1, 1 << 30))

                def call(method: str, **params):
                    n = next(ids)
                    ws.send(json.dumps({"id": n, "method": method, "params": params}))
                    while (answer := json.loads(ws.recv(timeout=30))).get("id") != n:
                        pass
                    return answer.get("result", {})

                call("Page.navigate", url=url)
                deadline = time.time() + 60
                while time.time() < deadline:
                    got = call("Runtime.evaluate", expression="document.body && document.body.dataset.overviewMs",
                               returnByValue=True)["result"].get("value")
                    if got:
                        return float(got)
                    time.sleep(0.05)
                return None
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def run(num_requests: int, repeats: int) -> dict:
    rng = random.Random(42)
    with tempfile.TemporaryDirectory() as directory:
        store = TraceStore(TraceStoreConfig(directory))
        filled = fill(store, num_requests, rng)
        api = JaegerQueryApi(store, "127.0.0.1", 0)
        api.start()
        queries, drill = {}, {}
        try:
            now_us = filled.pop("now_us")  # the hour the requests started in
            for metric in ("ttft", "e2e", "queue", "itl"):
                for service in ("", SERVICES[0]):
                    url = f"{api.url}/api/llm/heatmap?start={now_us - 3600_000_000}&end={now_us}&metric={metric}" + \
                        (f"&service={service}" if service else "")
                    body = urllib.request.urlopen(url).read()
                    data = json.loads(body)["data"]
                    key = f"heatmap_1h_{metric}" + ("_one_service" if service else "")
                    queries[key] = {**timed(lambda: urllib.request.urlopen(url).read(), repeats), "bytes": len(body),
                                    "requests": data["requests"], "cells": len(data["cells"])}
            hour = f"start={now_us - 3600_000_000}&end={now_us}"
            last5 = f"start={now_us - 300_000_000}&end={now_us}"
            for key, path in (("timeline_1h_1000_rows", f"timeline?{hour}&limit=1000"),  # no region: the whole hour
                              ("drill_down_1h_slow_ttft_200_rows", f"timeline?{hour}&metric=ttft&min=0.2&limit=200"),
                              ("drill_down_5m_slow_ttft_200_rows", f"timeline?{last5}&metric=ttft&min=0.2&limit=200"),
                              ("bubbleup_1h_slow_ttft", f"bubbleup?{hour}&metric=ttft&min=0.2"),
                              ("bubbleup_5m_slow_ttft", f"bubbleup?{last5}&metric=ttft&min=0.2")):
                url = f"{api.url}/api/llm/{path}"
                body = urllib.request.urlopen(url).read()
                data = json.loads(body)["data"]
                extra = {"matched": data["matched"], "rows": len(data["rows"]), "chosen": data["chosen"]} \
                    if "timeline" in path else {"dimensions": len(data)}
                drill[key] = {**timed(lambda: urllib.request.urlopen(url).read(), max(3, repeats // 4)),
                              "bytes": len(body), **extra}
            page = f"{api.url}/ui#{hour}"
            paints = [first_paint_ms(page) for _ in range(3)]
            drill["page_first_paint_1h"] = {"ms": paints, "median_ms": None if None in paints else sorted(paints)[1]}
        finally:
            api.stop()
        store.close()
        db = sqlite3.connect(store.path)  # as a store written before the overview
        with db:
            db.execute("DROP TABLE request_heat")
            db.execute("DROP TABLE request_load")
        db.close()
        t0 = time.perf_counter()
        TraceStore(TraceStoreConfig(directory)).close()
        upgrade_s = time.perf_counter() - t0
    worst = max(queries.values(), key=lambda q: q["p99_ms"])
    return {"requests": num_requests, "fill": filled, "queries": queries, "drill_down": drill,
            "open_store_from_before_s": round(upgrade_s, 2),
            "targets_met": {"heatmap_p99_ms<=300": worst["p99_ms"] <= 300,
                            "page_first_paint_ms<=1500": (drill["page_first_paint_1h"]["median_ms"] or 1e9) <= 1500,
                            "drill_down_200_rows_median_ms<=200": all(
                                q["median_ms"] <= 200 for k, q in drill.items() if k.startswith("drill_down")),
                            "heatmap_bytes<=200KB": max(q["bytes"] for q in queries.values()) <= 200_000,
                            "every_request_counted": all(q["requests"] == num_requests
                                                         for k, q in queries.items() if "one_service" not in k)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="20,000 requests, 5 repeats")
    args = p.parse_args()
    if args.quick:
        args.requests, args.repeats = 20_000, 5
    print(json.dumps(run(args.requests, args.repeats), indent=2))


if __name__ == "__main__":
    main()
