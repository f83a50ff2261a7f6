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
``python -m server serve --model dummy`` on a free port (telemetry fully on: metrics + OTLP
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

    python benchmarks/serve_bench.py --compare-telemetry --aa-control --num-requests 384 --ignore-eos --repeats 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from server.engine_process import engine_pids  # noqa: E402 (after the path is set)


def log(msg: str) -> None:
    print(f"[serve_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- workload

@dataclass
class Req:
    arrival_s: float  # offset from the start of the run
    prompt: str
    max_tokens: int


@dataclass
class Result:
    """One request as the client saw it: perf_counter stamps (CLOCK_MONOTONIC, comparable
    across processes) of the send, of every token chunk, and of the end of the stream."""

    ok: bool = False
    error: str | None = None
    t_send: float = 0.0
    times: list[float] = field(default_factory=list)
    t_end: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def make_prompt(n: int, seed: int) -> str:
    # Varied printable characters; the dummy tokenizer is byte-level, so ~n tokens.
    alphabet = "abcdefghijklmnopqrstuvwxyz "
    return "".join(alphabet[(seed * 7919 + i * 31) % len(alphabet)] for i in range(max(1, n)))


def poisson_workload(n: int, rate: float, prompt_len: int, max_tokens: int, seed: int) -> list[Req]:
    rng = np.random.default_rng(seed)
    if math.isinf(rate):
        arrivals = np.zeros(n)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
        arrivals -= arrivals[0]
    return [Req(float(a), make_prompt(prompt_len, i), max_tokens) for i, a in enumerate(arrivals)]


def trace_workload(path: str, time_scale: float, default_prompt_len: int, default_max_tokens: int,
                   limit: int | None) -> list[Req]:
    rows = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    if limit:
        rows = rows[:limit]
    if not rows:
        raise SystemExit(f"serve_bench: error: trace {path!r} has no requests")
    ts = [float(r.get("timestamp", 0.0)) for r in rows]
    t0 = ts[0]
    reqs, prev_ts, prev_arr = [], t0, 0.0
    for i, (r, t) in enumerate(zip(rows, ts)):
        arr = prev_arr + max(0.0, t - prev_ts) * time_scale
        prev_ts, prev_arr = t, arr
        prompt = r["prompt"] if "prompt" in r else make_prompt(int(r.get("prompt_len", default_prompt_len)), i)
        reqs.append(Req(arr, prompt, int(r.get("max_tokens", default_max_tokens))))
    return reqs


# --------------------------------------------------------------------------- client

class StreamClient:
    """A minimal HTTP/1.1 client for the load: pooled keep-alive connections, chunked SSE.

    Much cheaper per chunk than a general client (httpx costs ~50-100 us of Python per SSE
    event), so on a 2-core machine the client's own queueing stays out of its TTFT/ITL."""

    def __init__(self, url: str):
        parts = httpx.URL(url)
        self.host, self.port = parts.host, parts.port or 80
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post_sse(self, path: str, body: dict):
        """Yields (perf_counter at receipt, parsed JSON) per `data:` event; raises on non-200."""
        payload = json.dumps(body).encode()
        request = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                   f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
        while True:
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
            reader, writer = conn
            writer.write(request)
            try:
                status_line = await reader.readline()
            except ConnectionError:
                status_line = b""
            if status_line or not reused:
                break
            writer.close()  # the server closed an idle keep-alive connection: retry on another
        reusable = False
        try:
            if not status_line:
                raise ConnectionError("the server closed the connection without answering")
            status = int(status_line.split()[1])
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            if status != 200:
                n = int(headers.get("content-length", "0"))
                raise RuntimeError(f"HTTP {status}: {(await reader.readexactly(n))[:200]!r}")
            buf = b""
            while True:  # Transfer-Encoding: chunked
                line = await reader.readline()
                if not line:
                    raise ConnectionError("the server closed the connection in the middle of the stream")
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    reusable = True
                    return
                buf += (await reader.readexactly(size + 2))[:-2]
                now = time.perf_counter()
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if line.startswith(b"data:"):
                            data = line[5:].strip()
                            if data != b"[DONE]":
                                yield now, json.loads(data)
        finally:
            if reusable:
                self._idle.append(conn)
            else:
                writer.close()

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


async def one_request(client: StreamClient, model: str, req: Req, ignore_eos: bool, sem: asyncio.Semaphore) -> Result:
    res = Result()
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}
    if ignore_eos:
        body["ignore_eos"] = True
    async with sem:
        res.t_send = time.perf_counter()
        try:
            async for now, chunk in client.post_sse("/v1/completions", body):
                if chunk.get("error"):
                    res.error = str(chunk["error"])[:200]
                    return res
                if chunk.get("choices"):  # like vLLM's benchmark: a token chunk, even with text "" (the
                    res.times.append(now)  # token does not complete a character yet); the usage chunk has none
                usage = chunk.get("usage")
                if usage:
                    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    res.completion_tokens = int(usage.get("completion_tokens") or 0)
            res.t_end = time.perf_counter()
            res.ok = True
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            res.error = f"{type(exc).__name__}: {exc}"[:200]
    return res


def stats(values, scale: float = 1000.0) -> dict | None:
    a = np.asarray(values, dtype=float) * scale
    if not a.size:
        return None
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "n": int(a.size)}


async def run_requests(client: StreamClient, model: str, reqs: list[Req], concurrency: int,
                       ignore_eos: bool, label: str) -> tuple[list[Result], float, float]:
    """Runs the workload; (results, start, end) on the perf_counter clock."""
    sem = asyncio.Semaphore(concurrency)
    start = time.perf_counter()
    done = 0

    async def launch(r: Req) -> Result:
        nonlocal done
        delay = start + r.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        out = await one_request(client, model, r, ignore_eos, sem)
        done += 1
        if done % max(1, len(reqs) // 4) == 0 or done == len(reqs):
            log(f"{label}: {done}/{len(reqs)} done")
        return out

    results = await asyncio.gather(*(launch(r) for r in reqs))
    return results, start, time.perf_counter()


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
    }


async def run_load(client: StreamClient, model: str, reqs: list[Req], concurrency: int,
                   ignore_eos: bool, label: str) -> dict:
    return summarize(*await run_requests(client, model, reqs, concurrency, ignore_eos, label))


# --------------------------------------------------------------------------- metrics

SCRAPE_KEYS = ("vllm:request_success_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
               "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
               "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count")


def scrape(client: httpx.Client, url: str) -> dict | None:
    """The SCRAPE_KEYS samples of `url`'s /metrics, summed over label sets; None when it
    cannot be read or exposes no vLLM metrics (telemetry off)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        resp = client.get(f"{url}/metrics", timeout=30.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    sums: dict[str, float] = {}
    for fam in text_string_to_metric_families(resp.text):
        for s in fam.samples:
            if s.name in SCRAPE_KEYS:
                sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
    return sums if "vllm:request_success_total" in sums else None


def _deltas(before: dict | None, after: dict | None) -> dict | None:
    return None if before is None or after is None else {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SCRAPE_KEYS}


def counts(d: dict, load: dict) -> dict:
    """Server /metrics deltas `d` against the client's request and token counts (exact)."""
    out = {}
    for name, key, client in (("requests", "vllm:request_success_total", load["completed"]),
                              ("generation_tokens", "vllm:generation_tokens_total", load["total_completion_tokens"]),
                              ("prompt_tokens", "vllm:prompt_tokens_total", load["total_prompt_tokens"])):
        delta = int(round(d[key]))
        out[name] = {"server_delta": delta, "client": client, "exact": delta == client}
    return out


def fidelity(before: dict | None, after: dict | None, load: dict, client_ttft_mean_s: float | None,
             client_e2e_mean_s: float | None) -> dict | None:
    d = _deltas(before, after)
    if d is None:
        return None

    def tol(server: float | None, client: float | None) -> dict:
        if server is None or client is None:
            return {"server_ms": server and server * 1e3, "client_ms": client and client * 1e3,
                    "within_tolerance": False}
        diff = server - client
        return {"server_ms": server * 1e3, "client_ms": client * 1e3, "diff_ms": diff * 1e3,
                "tolerance_ms": max(0.05 * client, 0.002) * 1e3,
                "within_tolerance": abs(diff) <= max(0.05 * client, 0.002)}

    n_ttft, n_e2e = d["vllm:time_to_first_token_seconds_count"], d["vllm:e2e_request_latency_seconds_count"]
    return {
        **counts(d, load),
        "mean_ttft": tol(d["vllm:time_to_first_token_seconds_sum"] / n_ttft if n_ttft else None, client_ttft_mean_s),
        "mean_e2e": tol(d["vllm:e2e_request_latency_seconds_sum"] / n_e2e if n_e2e else None, client_e2e_mean_s),
    }


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


def cpu_per_token(before: dict[str, float], after: dict[str, float], tokens: int) -> dict:
    """Server CPU spent during a load, per process: seconds and microseconds per generated token."""
    out = {}
    for name in before.keys() & after.keys():
        used = after[name] - before[name]
        out[name] = {"cpu_s": round(used, 3), "us_per_token": round(used * 1e6 / tokens, 2) if tokens else None}
    return out


# --------------------------------------------------------------------------- server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ManagedServer:
    def __init__(self, model: str, telemetry_on: bool, otlp_url: str | None, max_num_seqs: int | None,
                 extra: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pids: dict[str, int] = {}  # "api", "engine" (not with --in-process): for CPU accounting
        cmd = [sys.executable, "-m", "server", "serve", "--model", model, "--port", str(self.port)]
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


# --------------------------------------------------------------------------- runs

def get_model(url: str, model: str | None) -> str:
    if model:
        return model
    try:
        return httpx.get(f"{url}/v1/models", timeout=10.0).json()["data"][0]["id"]
    except Exception:  # noqa: BLE001
        return "dummy"


def workloads(args) -> list[tuple[str, list[Req]]]:
    if args.trace:
        return [(f"trace x{args.time_scale}",
                 trace_workload(args.trace, args.time_scale, args.prompt_len, args.max_tokens, args.num_requests))]
    return [(f"rate={r}", poisson_workload(args.num_requests, r, args.prompt_len, args.max_tokens, args.seed))
            for r in args.rates]


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
            load["server_cpu"] = cpu_per_token(cpu_before, cpu_seconds(pids), load["total_completion_tokens"])
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


class _CountingSink:
    """Counts received spans and their names; no per-span records (a collector costs CPU,
    and on a 2-core machine it would be taken from the telemetry-on server)."""

    def __init__(self):
        self.spans, self.names, self._lock = 0, set(), threading.Lock()

    def __call__(self, signal, payload: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        if signal.value != "traces":
            return
        request = ExportTraceServiceRequest.FromString(payload)
        spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        with self._lock:
            self.spans += len(spans)
            self.names.update(s.name for s in spans)

    def stats(self) -> tuple[int, list[str], int]:
        with self._lock:
            return self.spans, sorted(self.names), 0


def _receiver_main(conn) -> None:
    from collector.otlp_receiver import OtlpReceiver

    sink = _CountingSink()
    with OtlpReceiver(sink) as rx:
        conn.send(rx.endpoint)
        while conn.recv() == "stats":
            conn.send(sink.stats())


class ReceiverProcess:
    """The OTLP receiver (collector.otlp_receiver, counting spans) in its own process, like a
    real collector: its decoding never competes with this client for the GIL."""

    def __enter__(self) -> "ReceiverProcess":
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_receiver_main, args=(child,), daemon=True)
        self._proc.start()
        self.pid = self._proc.pid
        self.endpoint = self._conn.recv()
        return self

    def stats(self) -> tuple[int, list[str], int]:
        """(spans received, distinct span names, spans dropped: always 0 here)."""
        self._conn.send("stats")
        return self._conn.recv()

    def __exit__(self, *exc) -> None:
        self._conn.send("stop")
        self._proc.join(timeout=10)


def wait_spans(rx: ReceiverProcess, timeout_s: float, settle_s: float = 1.5) -> int:
    deadline = time.monotonic() + timeout_s
    count, last_change = rx.stats()[0], time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        n = rx.stats()[0]
        if n != count:
            count, last_change = n, time.monotonic()
        elif count and time.monotonic() - last_change >= settle_s:
            break
    return count


def ratio(a, b):
    return a / b if a is not None and b else None


def _client_main(conn, url: str, model: str, warm: list[Req], reqs: list[Req], concurrency: int,
                 ignore_eos: bool, label: str) -> None:
    """A load client in its own process, so that it can be paused with its server: warm-up
    (opens the pooled connections), "ready", wait for "go", run the load, send back
    (results, start, end)."""
    try:
        from uvloop import run
    except ImportError:
        run = asyncio.run

    async def main():
        client = StreamClient(url)
        await run_requests(client, model, warm, concurrency, ignore_eos, f"{label} warmup")
        conn.send("ready")
        conn.recv()
        out = await run_requests(client, model, reqs, concurrency, ignore_eos, label)
        await client.aclose()
        return out

    results, start, end = run(main())
    conn.send(([vars(r) for r in results], start, end))  # plain dicts: Result is this script's class


def running_clock(windows: list[tuple[float, float]]):
    """Maps perf_counter stamps to running time: the length of the `windows` (sorted,
    disjoint (start, end) slices in which a process ran) before each stamp."""
    starts = np.array([w[0] for w in windows])
    lengths = np.array([w[1] - w[0] for w in windows])
    before = np.concatenate(([0.0], np.cumsum(lengths)))

    def clock(stamps) -> np.ndarray:
        t = np.asarray(stamps, dtype=float)
        i = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, None)
        return before[i] + np.clip(t - starts[i], 0.0, lengths[i])

    return clock


class _Group:
    """The processes that run together in one time slice: a server's process group (API
    process and engine), its load client and, for the telemetry-on server, the receiver."""

    def __init__(self, pgid: int, pids: list[int]):
        self.pgid, self.pids = pgid, pids

    def signal(self, sig: int) -> None:
        """Signals every process that is still there (one that died is reported by its load)."""
        for kill, target in ((os.killpg, self.pgid), *((os.kill, pid) for pid in self.pids)):
            try:
                kill(target, sig)
            except ProcessLookupError:
                pass


def time_sliced(servers: dict, reqs: list[Req], args, label: str, receiver_pid: int | None) -> dict[str, dict]:
    """Runs the same load against every server at once, time-sliced: one server (with its
    client) runs for `--slice` seconds while the others are stopped (SIGSTOP), in turn,
    until every load is done. On a shared VM the machine's speed moves by +-20% from one
    second to the next; slicing makes that noise hit every server alike. Client stamps are
    mapped to their server's running time (`running_clock`), so throughput, TTFT, ITL and
    e2e are those of a server that ran alone. Per server: the load summary, its CPU use per
    token, and (for servers with metrics) whether /metrics counted exactly what the client got."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    model = get_model(next(iter(servers.values())).url, args.model_name)
    warm = [Req(0.0, make_prompt(args.prompt_len, 10_000 + i), args.max_tokens) for i in range(args.concurrency)]
    conns, procs, groups = {}, {}, {}
    for mode, srv in servers.items():
        conns[mode], child = ctx.Pipe()
        procs[mode] = ctx.Process(target=_client_main, daemon=True, args=(
            child, srv.url, model, warm, reqs, args.concurrency, args.ignore_eos, f"{label} {mode}"))
        procs[mode].start()
    for mode, srv in servers.items():
        if conns[mode].recv() != "ready":
            raise RuntimeError(f"the {mode} client did not start")
        extra = [receiver_pid] if mode == "on" and receiver_pid else []
        groups[mode] = _Group(srv.proc.pid, [procs[mode].pid, *extra])
    with httpx.Client(timeout=30.0) as http:
        before = {m: scrape(http, srv.url) for m, srv in servers.items()}
    cpu_before = {m: cpu_seconds(srv.pids) for m, srv in servers.items()}
    windows: dict[str, list] = {m: [] for m in servers}
    outcome: dict[str, tuple] = {}
    try:
        for group in groups.values():
            group.signal(signal.SIGSTOP)
        for conn in conns.values():
            conn.send("go")  # read by each client when it first runs
        deadline = time.monotonic() + args.load_timeout * len(servers)
        while len(outcome) < len(servers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: the loads of {sorted(set(servers) - set(outcome))} did not finish "
                                   f"within --load-timeout {args.load_timeout} s of running time each")
            for mode, group in groups.items():
                if mode in outcome:
                    continue
                t0 = time.perf_counter()
                group.signal(signal.SIGCONT)
                if conns[mode].poll(args.slice):
                    try:
                        outcome[mode] = conns[mode].recv()
                    except EOFError:
                        raise RuntimeError(f"{label}: the {mode} load client died") from None
                group.signal(signal.SIGSTOP)
                windows[mode].append((t0, time.perf_counter()))
    finally:
        for group in groups.values():
            group.signal(signal.SIGCONT)
    out = {}
    with httpx.Client(timeout=30.0) as http:
        for mode, srv in servers.items():
            results, start, end = outcome[mode]
            load = summarize([Result(**r) for r in results], start, end, running_clock(windows[mode]))
            load["server_cpu"] = cpu_per_token(cpu_before[mode], cpu_seconds(srv.pids), load["total_completion_tokens"])
            load["slices"] = len(windows[mode])
            d = _deltas(before[mode], scrape(http, srv.url))
            load["counts"] = d and counts(d, load)
            log(f"{label} {mode}: {load['completed']}/{load['requests']} ok, "
                f"{load['output_token_throughput']:.0f} tok/s over {load['wall_s']:.2f} s of running time")
            out[mode] = load
    for proc in procs.values():
        proc.join(timeout=10)
    return out


def compare_telemetry(args) -> dict:
    """`--repeats` rounds; each starts the servers afresh (telemetry off, on, and with
    `--aa-control` a second off server, "control") and runs the saturation load against all
    of them time-sliced (`time_sliced`). Headline ratios are medians over rounds of the
    per-round on/off ratios; the control/off ratios are what two identical servers measure
    here, the resolution of the method."""
    modes = ("off", "on", "control") if args.aa_control else ("off", "on")
    name, reqs = workloads(args)[0]
    rounds = []
    with ReceiverProcess() as rx:
        traces_url = None if args.no_traces else f"{rx.endpoint}/v1/traces"
        for r in range(args.repeats):
            order = modes[r % len(modes):] + modes[:r % len(modes)]  # each mode leads the slices in turn
            servers = {mode: ManagedServer(args.server_model, mode == "on", traces_url, args.max_num_seqs,
                                           args.server_arg) for mode in order}
            try:
                for srv in servers.values():
                    srv.wait_ready()
                rounds.append(time_sliced(servers, reqs, args, f"round {r + 1}", rx.pid))
            finally:
                for srv in servers.values():
                    srv.stop()
        spans_before_shutdown = wait_spans(rx, args.span_wait)
        spans, span_names, _ = rx.stats()
    p99 = lambda load: load["itl_ms"] and load["itl_ms"]["p99"]  # noqa: E731
    result: dict = {"workload": name, "method": "time_sliced", "slice_s": args.slice}
    for other, prefix, suffix in (("on", "", "_on_vs_off"), ("control", "control_", "")):
        if other in modes:
            thr = [ratio(rd[other]["output_token_throughput"], rd["off"]["output_token_throughput"]) for rd in rounds]
            itl = [ratio(p99(rd[other]), p99(rd["off"])) for rd in rounds]
            result[f"{prefix}throughput_ratio{suffix}"] = _median(thr)
            result[f"{prefix}p99_itl_ratio{suffix}"] = _median(itl)
            result[f"{prefix}throughput_ratio_ci90"] = _median_ci90(thr)
            result[f"{prefix}p99_itl_ratio_ci90"] = _median_ci90(itl)
            result[f"{prefix}throughput_ratio_per_round"] = [round(x, 4) for x in thr]
            result[f"{prefix}p99_itl_ratio_per_round"] = [round(x, 4) for x in itl]
    result["tok_s_per_round"] = {m: [round(rd[m]["output_token_throughput"]) for rd in rounds] for m in modes}
    result["p99_itl_ms_per_round"] = {m: [round(p99(rd[m]), 3) for rd in rounds] for m in modes}
    cpu = {}
    for proc in ("api", "engine"):
        per_mode = {m: _median([rd[m]["server_cpu"].get(proc, {}).get("us_per_token") for rd in rounds])
                    for m in modes}
        cpu[proc] = {**per_mode, "ratio_on_vs_off": ratio(per_mode["on"], per_mode["off"])}
    result["server_cpu_us_per_token"] = cpu
    result["counts_exact_every_round"] = all(
        rd["on"]["counts"] and all(c["exact"] for c in rd["on"]["counts"].values()) for rd in rounds)
    result["failed_requests"] = sum(rd[m]["failed"] for rd in rounds for m in modes)
    result["valid"] = result["failed_requests"] == 0 and result["counts_exact_every_round"]
    if not result["valid"]:
        log(f"WARNING: {result['failed_requests']} requests failed or /metrics counts were off: "
            "the ratios do not compare like with like (see rounds[*][mode]['errors'] and ['counts'])")
    result["spans_received"] = spans
    result["spans_received_before_shutdown"] = spans_before_shutdown
    result["span_names"] = span_names
    result["rounds"] = rounds
    return result


def _median_ci90(values: list) -> list[float] | None:
    """A 90% bootstrap interval of the median of per-round ratios (rounds resampled)."""
    values = np.array([v for v in values if v is not None])
    if values.size < 2:
        return None
    medians = np.median(np.random.default_rng(0).choice(values, (10_000, values.size)), axis=1)
    return [round(float(x), 4) for x in np.percentile(medians, [5, 95])]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def parse_rate(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"rate must be > 0 or inf, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--url", default=None, help="benchmark a running server (e.g. http://127.0.0.1:8000)")
    src.add_argument("--start-server", action="store_true", help="launch python -m server serve on a free port")
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
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
