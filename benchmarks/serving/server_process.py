"""A server this benchmark starts (`python -m otel_llm serve`, or `serve-pipeline`), and the CPU its processes use."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.serving import REPO_ROOT, log
from otel_llm.server.engine_process import engine_pids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ManagedServer:
    def __init__(self, model: str, telemetry_on: bool, otlp_url: str | None, max_num_seqs: int | None,
                 extra: list[str], command: str = "serve"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pids: dict[str, int] = {}  # "api", "engine" (not with --in-process): for CPU accounting
        cmd = [sys.executable, "-m", "otel_llm", command, "--model", model, "--port", str(self.port)]
        if max_num_seqs:
            cmd += ["--max-num-seqs", str(max_num_seqs)]
        env = dict(os.environ)
        for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            env.pop(k, None)
        if telemetry_on:
            env["OTEL_TRACES_SAMPLER"] = "always_on"
            if otlp_url:
                cmd += ["--otlp-traces-endpoint", otlp_url]
        else:
            cmd += ["--disable-log-stats"]
        cmd += extra
        self.cmd = cmd
        self.logfile = tempfile.NamedTemporaryFile(prefix="serve_bench_server_", suffix=".log", delete=False)
        log(f"starting server: {' '.join(cmd[1:])} (log: {self.logfile.name})")
        self.proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=env, stdout=self.logfile,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.logfile.name}:\n"
                                   + Path(self.logfile.name).read_text()[-2000:])
            try:
                resp = httpx.get(f"{self.url}/health", timeout=2.0)
                if resp.status_code == 200:
                    log(f"server ready at {self.url}")
                    self.pids = {"api": self.proc.pid}
                    engines = engine_pids(self.proc.pid)  # none with --in-process
                    if engines:
                        self.pids["engine"] = engines[0]
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout_s}s; see {self.logfile.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
        self.logfile.close()


def get_model(url: str, model: str | None) -> str:
    if model:
        return model
    try:
        return httpx.get(f"{url}/v1/models", timeout=10.0).json()["data"][0]["id"]
    except Exception:  # noqa: BLE001
        return "dummy"


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds of each process so far (Linux /proc; empty elsewhere)."""
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def cpu_per_token(before: dict[str, float], after: dict[str, float], load: dict) -> dict:
    """Server CPU spent during a load (`summarize`'s figures), per process: seconds, and microseconds
    per generated token and per streamed chunk (several tokens share a chunk when the server
    falls behind its engine, so both are needed to tell a frontend's cost)."""
    tokens, chunks = load["total_completion_tokens"], load["chunks"]
    out = {}
    for name in before.keys() & after.keys():
        used = after[name] - before[name]
        out[name] = {"cpu_s": round(used, 3), "us_per_token": round(used * 1e6 / tokens, 2) if tokens else None,
                     "us_per_chunk": round(used * 1e6 / chunks, 2) if chunks else None}
    return out
