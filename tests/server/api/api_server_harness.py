"""Test harness: a real `otel-llm serve --model dummy` in a subprocess, on its own
loopback port, plus `/metrics` helpers. (Not named conftest: test modules import it.)"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from otel_llm.server.demo import scrape

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m otel_llm serve --model dummy ...` (or another `command`: `serve-pipeline`); stopped with
    SIGINT (graceful)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, command: str = "serve",
                 tls: ssl.SSLContext | None = None, own_group: bool = False):
        """`tls`: the server serves HTTPS (its flags are in `args`); the client context that reaches it.
        `own_group`: in a process group of its own (with its engine), which a test may signal whole."""
        self.command = command
        self.own_group = own_group
        self.port = free_port()
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.args = ["--model", "dummy", "--port", str(self.port), "--log-stats-interval", "3600", *args]
        self.env = {**os.environ, **(env or {})}
        self.log = tempfile.NamedTemporaryFile("w+", prefix="otel-llm-serve-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> ServerProcess:
        self.proc = subprocess.Popen([sys.executable, "-m", "otel_llm", self.command, *self.args], cwd=REPO, env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=self.own_group)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2, verify=self.tls or True).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout_s} s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def stop(self) -> None:
        self.terminate()
        self.log.close()
        os.unlink(self.log.name)

    def terminate(self) -> None:
        """SIGINT and wait (the log stays readable until `stop`)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def health(self) -> httpx.Response:
        return httpx.get(f"{self.url}/health", timeout=10, verify=self.tls or True)

    def metrics(self) -> dict:
        """{sample name: {frozenset(label items): value}}"""
        return scrape(self.url)


def sample(metrics: dict, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for k, v in metrics.get(name, {}).items() if want <= set(k))


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


class TraceSink(ThreadingHTTPServer):
    """Minimal OTLP/HTTP protobuf traces endpoint: keeps every span it receives."""

    def __init__(self):
        self.spans: list = []
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                with sink.lock:
                    for rs in req.resource_spans:
                        for ss in rs.scope_spans:
                            sink.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def snapshot(self) -> list:
        with self.lock:
            return list(self.spans)

    def server(self, *args: str, command: str = "serve", env: dict[str, str] | None = None) -> ServerProcess:
        """A started server exporting its spans here at once (batch delay 100 ms)."""
        return ServerProcess("--otlp-traces-endpoint", f"http://127.0.0.1:{self.server_address[1]}", *args,
                             command=command, env={"OTEL_BSP_SCHEDULE_DELAY": "100", **(env or {})}).start()
