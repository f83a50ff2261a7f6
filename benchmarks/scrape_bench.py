"""The cost of scraping a vLLM fleet: the collector's scrape receiver next to a real Prometheus.

`--targets` local HTTP targets (a child process: HTTP/1.1 keep-alive, as vLLM's uvicorn serves)
each answer GET /metrics with the real vLLM 0.32 body (tests/collector/data/vllm_metrics.txt, 626
lines). By default every answer's values move on (each sample but `_created` gains the request's
number), as a loaded server's do; `--static` serves the body unchanged. Over the same targets,
one after the other, for `--seconds` each, scraping every `--interval`:

- prometheus: a real Prometheus (`/usr/bin/prometheus`: scrape, parse, TSDB append).
- collector: `otel-llm collector --scrape-target URL` (x targets), as a user runs it.

Each one's CPU (utime + stime of its process, /proc) per scrape completed in the window after
every target was scraped twice. Scrapes are counted by the targets (GETs answered per
User-Agent), and by each tool itself: Prometheus's `prometheus_target_interval_length_seconds_count`,
the collector's `otelcol_receiver_accepted_metric_points_total{receiver="prometheus"}` over the
points one scrape gives. Reported: ms CPU per scrape of each, and `ratio` = collector / Prometheus.

- in_process: one target's path without HTTP, µs per body by phase (median over `--repeats`):
  `convert_us` (text -> OTLP bytes, the values moving on each time), `ingest_us` (the store
  applies them), `drop_unseen_us` (staleness: the search for vanished series, skipped as the
  scraper skips it when the body kept the last one's shape), `total_us`; `first_convert_us` (a new target:
  nothing cached); `scrape_once_us`: CPU of a whole `Scraper.scrape_once` (HTTP GET included) on
  this process's threads (the target answers from the child process).

Targets (issue 38, the "targets" booleans): ratio <= 2; every target up in both.

Usage: python benchmarks/scrape_bench.py [--quick] [--targets 20] [--seconds 30] [--static]
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otel_llm.collector.exporter.prometheus.metric_store import MetricStore, StoreConfig  # noqa: E402
from otel_llm.collector.receiver.scrape import Scraper, ScrapeTarget  # noqa: E402
from otel_llm.collector.receiver.scrape_convert import Converter  # noqa: E402
from tests.harness.ports import free_port  # noqa: E402

BODY = (ROOT / "tests" / "collector" / "data" / "vllm_metrics.txt").read_text()
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_VARIANTS = 64  # distinct bodies a target cycles through


def variants(body: str, count: int) -> list[bytes]:
    """`count` bodies: the n-th has n added to every sample's value but the `_created` ones
    (histograms stay cumulative: each bucket, `_count` and `_sum` gain the same)."""
    lines = body.split("\n")
    out = []
    for n in range(count):
        moved = []
        for line in lines:
            head, _, value = line.rpartition(" ")
            if n and line and not line.startswith("#") and "_created" not in head:
                line = f"{head} {float(value) + n!r}"
            moved.append(line)
        out.append("\n".join(moved).encode())
    return out


def serve_targets(count: int, static: bool, ports, ready) -> None:
    """The child process: `count` targets on loopback; GET /hits answers {user agent: GETs of /metrics}."""
    bodies = variants(BODY, 1 if static else _VARIANTS)
    hits: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn
        disable_nagle_algorithm = True  # as uvicorn (else each answer waits out a delayed ACK)

        def do_GET(self):
            if self.path == "/hits":
                with lock:
                    data = json.dumps(hits).encode()
                content_type = "application/json"
            else:
                agent = self.headers.get("User-Agent", "").split("/")[0]
                with lock:
                    n = hits[agent] = hits.get(agent, 0) + 1
                data, content_type = bodies[n % len(bodies)], "text/plain; version=0.0.4; charset=utf-8"
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    servers = []
    for _ in range(count):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    for i, server in enumerate(servers):
        ports[i] = server.server_address[1]
    ready.set()
    threading.Event().wait()


class Targets:
    def __init__(self, count: int, static: bool) -> None:
        ctx = multiprocessing.get_context("fork")
        self.ports = ctx.Array("i", count)
        ready = ctx.Event()
        self.proc = ctx.Process(target=serve_targets, args=(count, static, self.ports, ready), daemon=True)
        self.proc.start()
        if not ready.wait(30):
            raise RuntimeError("the targets did not start")
        self.urls = [f"http://127.0.0.1:{p}/metrics" for p in self.ports]

    def hits(self, agent: str) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[0]}/hits", timeout=5) as answer:
            return json.load(answer).get(agent, 0)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.join(5)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def metric_sum(url: str, name: str, having: str = "") -> float:
    """The sum of a family's samples named `name` (with `having` in their labels) on a /metrics."""
    conn = http.client.HTTPConnection(url, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(m[2]) for m in pattern.finditer(text) if having in (m[1] or ""))


def wait_until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def measure(proc: subprocess.Popen, targets: Targets, agent: str, seconds: float, own_count) -> dict:
    """CPU per scrape of `proc` over `seconds`, once every target has been scraped twice."""
    n = len(targets.urls)
    wait_until(lambda: targets.hits(agent) >= 2 * n, 60, f"{agent} to scrape every target twice")
    hits0, own0, cpu0, t0 = targets.hits(agent), own_count(), cpu_s(proc.pid), time.monotonic()
    time.sleep(seconds)
    hits1, own1, cpu1, t1 = targets.hits(agent), own_count(), cpu_s(proc.pid), time.monotonic()
    scrapes = hits1 - hits0
    return {"seconds": round(t1 - t0, 2), "scrapes": scrapes, "scrapes_own_count": round(own1 - own0, 1),
            "cpu_s": round(cpu1 - cpu0, 3), "ms_cpu_per_scrape": round(1000 * (cpu1 - cpu0) / max(scrapes, 1), 3)}


def run_prometheus(targets: Targets, interval: str, seconds: float, workdir: Path) -> dict:
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(f"global: {{scrape_interval: {interval}, scrape_timeout: {interval}}}\n"
                      "scrape_configs:\n  - job_name: vllm\n    static_configs:\n"
                      f"      - targets: {json.dumps([u.split('/')[2] for u in targets.urls])}\n")
    proc = subprocess.Popen([shutil.which("prometheus") or "/usr/bin/prometheus", f"--config.file={config}",
                             f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"127.0.0.1:{port}"
        result = measure(proc, targets, "Prometheus", seconds,
                         lambda: metric_sum(url, "prometheus_target_interval_length_seconds_count"))
        with urllib.request.urlopen(f"http://{url}/api/v1/query?query=sum(up)%20and%20sum(scrape_samples_scraped)",
                                    timeout=10) as answer:
            up = json.load(answer)["data"]["result"]
        result["targets_up"] = int(float(up[0]["value"][1])) if up else 0
        return result
    finally:
        proc.terminate()
        proc.wait(10)


def run_collector(targets: Targets, interval: str, seconds: float, points_per_scrape: int) -> dict:
    port = free_port()
    command = [sys.executable, "-m", "otel_llm", "collector", "--otlp-http-port", "0", "--otlp-grpc-port", "0",
               "--prometheus-port", str(port), "--scrape-interval", interval]
    for url in targets.urls:
        command += ["--scrape-target", f"vllm={url}"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"127.0.0.1:{port}"
        wait_until(lambda: proc.poll() is None and _answers(url), 60, "the collector to start")
        result = measure(proc, targets, "otel-llm-collector", seconds,
                         lambda: metric_sum(url, "otelcol_receiver_accepted_metric_points_total",
                                            'receiver="prometheus"') / points_per_scrape)
        result["targets_up"] = int(metric_sum(url, "up"))
        return result
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(url: str) -> bool:
    try:
        metric_sum(url, "up")
        return True
    except OSError:
        return False


def in_process(repeats: int, targets: Targets) -> dict:
    bodies = [b.decode() for b in variants(BODY, _VARIANTS)]
    extra = {"up": 1.0, "scrape_duration_seconds": 0.001}
    converter = Converter("vllm", "127.0.0.1:8000")
    store = MetricStore(StoreConfig())
    phases: dict[str, list[float]] = {"convert_us": [], "ingest_us": [], "drop_unseen_us": []}
    for i in range(repeats + 5):
        text = bodies[i % len(bodies)]
        since = store.clock()
        t0 = time.process_time_ns()
        payload = converter.convert(text, False, time.time_ns(), extra)
        t1 = time.process_time_ns()
        store.ingest(payload)
        t2 = time.process_time_ns()
        if not converter.same_series:  # as the scraper: a body of the last one's shape has every series again
            store.drop_unseen(converter.resource_key, since)
        t3 = time.process_time_ns()
        if i >= 5:  # warm
            for key, ns in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
                phases[key].append(ns / 1000)
    result = {k: round(statistics.median(v), 1) for k, v in phases.items()}
    result["total_us"] = round(sum(result.values()), 1)
    firsts = []
    for i in range(max(3, repeats // 20)):
        t0 = time.process_time_ns()
        Converter("vllm", f"127.0.0.1:{i}").convert(bodies[i % len(bodies)], False, time.time_ns(), extra)
        firsts.append((time.process_time_ns() - t0) / 1000)
    result["first_convert_us"] = round(statistics.median(firsts), 1)
    scraper = Scraper(ScrapeTarget(targets.urls[0], "vllm", 60.0, 5.0), MetricStore(StoreConfig()))
    scrapes = []
    for i in range(repeats + 5):
        t0 = time.process_time_ns()
        assert scraper.scrape_once(), scraper.last_error
        if i >= 5:
            scrapes.append((time.process_time_ns() - t0) / 1000)
    result["scrape_once_us"] = round(statistics.median(scrapes), 1)
    return result


def points_per_scrape() -> int:
    store = MetricStore(StoreConfig())
    result = store.ingest(Converter("vllm", "h:1").convert(BODY, False, time.time_ns(),
                                                           {"up": 1.0, "scrape_duration_seconds": 0.0}))
    return result.accepted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test, not a measurement)")
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured time per scraper")
    parser.add_argument("--interval", default="1s", help="scrape interval (a Prometheus duration)")
    parser.add_argument("--repeats", type=int, default=300, help="bodies per in-process figure")
    parser.add_argument("--static", action="store_true", help="serve the body unchanged (default: values move on)")
    parser.add_argument("--skip-prometheus", action="store_true", help="only the collector (and in-process)")
    args = parser.parse_args(argv)
    if args.quick:
        args.targets, args.seconds, args.repeats = min(args.targets, 3), min(args.seconds, 3.0), 20
    targets = Targets(args.targets, args.static)
    try:
        per_scrape = points_per_scrape()
        result = {"scrape_targets": args.targets, "interval": args.interval, "seconds": args.seconds,
                  "body_lines": BODY.count("\n"), "body_bytes": len(BODY.encode()), "values_move": not args.static,
                  "points_per_scrape": per_scrape, "in_process": in_process(args.repeats, targets)}
        if not args.skip_prometheus:
            with tempfile.TemporaryDirectory(prefix="scrape-bench-") as workdir:
                result["prometheus"] = run_prometheus(targets, args.interval, args.seconds, Path(workdir))
        result["collector"] = run_collector(targets, args.interval, args.seconds, per_scrape)
    finally:
        targets.close()
    ours = result["collector"]["ms_cpu_per_scrape"]
    if "prometheus" in result:  # (none when Prometheus used less than one clock tick: a --quick run)
        theirs = result["prometheus"]["ms_cpu_per_scrape"]
        result["ratio"] = round(ours / theirs, 2) if theirs > 0 else None
    result["targets"] = {
        "every_target_up": result["collector"]["targets_up"] == args.targets and
        result.get("prometheus", {}).get("targets_up", args.targets) == args.targets,
        "cpu_per_scrape_at_most_2x_prometheus": result.get("ratio") is not None and result["ratio"] <= 2,
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
