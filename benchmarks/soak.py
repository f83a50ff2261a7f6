"""Soak benchmark: mixed load on the dummy model for `--minutes`, against a server it starts,
with the trace backend flapping and the engine killed once; one JSON object at the end.

    python benchmarks/soak.py --minutes 10

The server is `python -m otel_llm serve --model dummy --max-request-bytes 1048576
--otlp-traces-endpoint <backend>` (`serve_bench.ManagedServer`, `OTEL_BSP_SCHEDULE_DELAY=500`).
`--concurrency` workers (8) each send one request after another until the time is up, drawn
from this mix (seeded):
- generations (70%): completions and chat, streaming and not, `max_tokens` 8-160, some with a
  stop string; one in five has `n` = 2..4 (with `ignore_eos`, so every choice ends `length` and
  the request's finish reason on the server is known to the client);
- cut streams (12%): `max_tokens` 1800 with `ignore_eos`, closed by the client after 2-4 chunks,
  which the server counts `abort`;
- hostile requests (18%, `HOSTILE`): bad values, wrong types, malformed JSON, unknown model and
  path, wrong method, a body that is not UTF-8, 5 MB bodies (declared and chunked) over the
  1 MiB limit, refused fields (`tools`, ...): each must get a 4xx.

Meanwhile:
- the OTLP/HTTP trace backend (`otel_llm.collector.receiver.otlp_http.OtlpReceiver`, in a process of its own
  on a fixed port) is up for the first half of every minute and killed for the second half;
- `/metrics` is scraped every second (`otel_llm.server.demo.scrape`): it must parse, and no counter,
  histogram count, sum or bucket may go backwards;
- at half time the engine process is killed (SIGKILL); the server must restart it by itself
  (`/health` "restarting", then "ok" with `engine_restarts` 1). Requests sent before the
  restart was seen over and ended after the kill may fail (a 5xx, or an error event in a
  stream): "5xx during restart". Cut streams are held back from just before the kill until
  the restart is over: a client that cuts its stream as the engine dies cannot know whether
  the server counts it `abort` or `error`.

Runs shorter than 4 minutes (`--seconds`, for tests) scale the schedule: "first minute" is a
quarter of the run, the backend flaps every half run.

At the end the server's counters are left to settle (nothing running or waiting, the span
queue empty, counts unchanged), then `vllm:request_success_total` by `finished_reason` is
compared exactly with what the client saw: `stop`/`length` from the finish reason of every
completed request (an `n` > 1 request is one request), `abort` = cut streams, `error` = the
requests that failed after reaching the engine (500s and stream error events; a 503 is counted
only when the server had already registered the request: `ENGINE_LOST_AT_HANDOVER`; 4xx
and the other 503s are refused before they reach it and are not counted).

Reported: requests by outcome, the counts and whether they are exact, RSS of the API and
engine processes (start, after the first minute, end; the engine is a new process after the
kill, so its growth is measured from a minute after the restart when the run is long enough),
the engine restart, the server's span-export counters and what the backend received, the
/metrics checks, and pass/fail `targets`. Progress goes to stderr every 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import httpx
import openai

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.serving.server_process import ManagedServer, free_port  # noqa: E402 (after the path is set)
from otel_llm.server.api.serving import ENGINE_LOST_AT_HANDOVER  # noqa: E402
from otel_llm.server.demo import scrape  # noqa: E402
from otel_llm.server.engine_process import engine_pids  # noqa: E402

MAX_REQUEST_BYTES = 1 << 20
REASONS = ("stop", "length", "abort", "error")
_MONOTONIC_SUFFIXES = ("_total", "_count", "_sum", "_bucket")


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Schedule:
    """When things happen, in seconds from the start of the load."""

    duration_s: float
    first_minute_s: float  # RSS after it is the baseline of the growth figures
    kill_at_s: float
    outage_period_s: float  # the backend is down for the second half of every period

    @classmethod
    def for_duration(cls, duration_s: float) -> "Schedule":
        return cls(duration_s, min(60.0, duration_s / 4), duration_s / 2, min(60.0, duration_s / 2))


# --------------------------------------------------------------------------- outcomes

@dataclass(frozen=True)
class Outcome:
    """One request as the client saw it. `counted_as`: the `finished_reason` the server counts
    it under (None: not counted: refused before the engine, or unknown to the client)."""

    kind: str
    result: str  # "ok" | "cut" | "http_error" | "stream_error" | "transport_error" | "accepted" (hostile, 2xx)
    status: int | None
    counted_as: str | None
    t_send: float
    t_end: float
    message: str = ""


def _counted_as_error(status: int, message: str) -> bool:
    """Whether the server counts a 5xx as a request finished with `error` (`OpenAIServing._serve`):
    yes when it had registered the request (500: the engine died under it; 503 with
    `ENGINE_LOST_AT_HANDOVER`: it died as the request was handed over), no for the 503 of a server that already
    knew its engine was gone (refused before registration, like a 4xx)."""
    return status != 503 or ENGINE_LOST_AT_HANDOVER in message


def classify(o: Outcome, kill_s: float | None, restarted_s: float | None) -> str:
    if o.result == "ok":
        return f"ok_{o.counted_as}"
    if o.result in ("cut", "transport_error", "accepted"):
        return {"cut": "client_cut", "accepted": "hostile_accepted"}.get(o.result, o.result)
    if o.status is not None and 400 <= o.status < 500:
        return f"4xx_{o.status}"
    during = kill_s is not None and o.t_end > kill_s and (restarted_s is None or o.t_send < restarted_s)
    return "5xx_during_restart" if during else "5xx_otherwise"


def request_summary(outcomes: list[Outcome], kill_s: float | None, restarted_s: float | None) -> dict:
    counts = Counter(classify(o, kill_s, restarted_s) for o in outcomes)
    return {
        "total": len(outcomes),
        "ok": {k[3:]: v for k, v in sorted(counts.items()) if k.startswith("ok_")},
        "client_cut": counts["client_cut"],
        "4xx": {k[4:]: v for k, v in sorted(counts.items()) if k.startswith("4xx_")},
        "5xx_during_restart": counts["5xx_during_restart"],
        "5xx_otherwise": counts["5xx_otherwise"],
        "transport_errors": counts["transport_error"],
        "hostile_accepted": counts["hostile_accepted"],
        "by_kind": dict(sorted(Counter(o.kind.split(":")[0] for o in outcomes).items())),
    }


# --------------------------------------------------------------------------- load

class Hostile(NamedTuple):
    name: str
    method: str
    path: str
    body: object  # a dict (sent as JSON), bytes, or a callable returning an async iterator (chunked)
    expected: int


def _hostile_requests(model: str) -> tuple[Hostile, ...]:
    big = b'{"model": "%s", "prompt": "' % model.encode() + b"a" * 5_000_000 + b'"}'

    async def chunked():
        for i in range(0, len(big), 1 << 16):
            yield big[i:i + (1 << 16)]

    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    cmpl = {"model": model, "prompt": "hi"}
    return (
        Hostile("negative_max_tokens", "POST", "/v1/completions", {**cmpl, "max_tokens": -1}, 400),
        Hostile("negative_temperature", "POST", "/v1/chat/completions", {**chat, "temperature": -1}, 400),
        Hostile("n_above_max_num_seqs", "POST", "/v1/completions", {**cmpl, "n": 65}, 400),
        Hostile("seed_beyond_64_bits", "POST", "/v1/completions", {**cmpl, "seed": 1 << 70}, 400),
        Hostile("prompt_over_context", "POST", "/v1/completions", {**cmpl, "prompt": "a" * 5000}, 400),
        Hostile("empty_messages", "POST", "/v1/chat/completions", {**chat, "messages": []}, 400),
        Hostile("wrong_type", "POST", "/v1/completions", {**cmpl, "max_tokens": "many"}, 422),
        Hostile("malformed_json", "POST", "/v1/completions", b'{"model": "dummy", "prompt": ', 422),
        Hostile("unknown_model", "POST", "/v1/chat/completions", {**chat, "model": "no-such-model"}, 404),
        Hostile("unknown_path", "POST", "/v1/no-such-path", cmpl, 404),
        Hostile("wrong_method", "GET", "/v1/chat/completions", None, 405),
        Hostile("not_utf8", "POST", "/v1/completions", b'{"model": "dummy", "prompt": "\xff\xfe"}', 400),
        Hostile("body_5mb_declared", "POST", "/v1/completions", big, 413),
        Hostile("body_5mb_chunked", "POST", "/v1/completions", chunked, 413),
        Hostile("tools", "POST", "/v1/chat/completions", {**chat, "tools": [{"type": "function"}]}, 400),
        Hostile("response_format", "POST", "/v1/chat/completions",
                {**chat, "response_format": {"type": "json_object"}}, 400),
        Hostile("logprobs", "POST", "/v1/completions", {**cmpl, "logprobs": 3}, 400),
    )


class Load:
    """The workers' shared state (event-loop thread only): clients, outcomes, and the cut-stream
    hold around the engine kill."""

    def __init__(self, url: str, model: str):
        self.model = model
        self.openai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="soak", max_retries=0, timeout=120)
        self.http = httpx.AsyncClient(base_url=url, timeout=120)
        self.hostile = _hostile_requests(model)
        self.outcomes: list[Outcome] = []
        self.hold_cuts = False
        self.cuts_in_flight = 0
        self.last_cut_end = 0.0

    async def aclose(self) -> None:
        await self.openai.close()
        await self.http.aclose()

    async def worker(self, seed: int, deadline: float) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            x = rng.random()
            if x < 0.18:
                outcome = await self._hostile(rng.choice(self.hostile))
            elif x < 0.30 and not self.hold_cuts:
                outcome = await self._cut_stream(rng)
            else:
                outcome = await self._generate(rng)
            self.outcomes.append(outcome)
            if outcome.status == 503:
                await asyncio.sleep(0.1)  # the engine is restarting: back off as a client would

    def _prompt(self, rng: random.Random, chat: bool, words: int) -> dict:
        text = " ".join(rng.choice(("soak", "token", "cache", "span", "metric", "engine", "queue"))
                        for _ in range(words))
        return {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}

    async def _generate(self, rng: random.Random) -> Outcome:
        chat, stream = rng.random() < 0.5, rng.random() < 0.5
        n = rng.randint(2, 4) if rng.random() < 0.2 else 1
        params = {"max_tokens": rng.randint(8, 160), "n": n, "temperature": rng.choice((0.7, 1.0)),
                  "seed": rng.randrange(1 << 31), **self._prompt(rng, chat, rng.randint(1, 30))}
        extra = {"ignore_eos": True} if n > 1 else {}  # every choice ends `length`: the request's reason is known
        if n == 1 and rng.random() < 0.3:
            params["stop"] = [rng.choice("aeiou")]
        kind = f"{'chat' if chat else 'completion'}{'_stream' if stream else ''}{'_n' if n > 1 else ''}"
        create = self.openai.chat.completions.create if chat else self.openai.completions.create
        t_send = time.monotonic()
        try:
            reasons: dict[int, str] = {}
            if stream:
                response = await create(model=self.model, stream=True, stream_options={"include_usage": True},
                                        extra_body=extra, **params)
                async with response:
                    async for chunk in response:
                        reasons.update((c.index, c.finish_reason) for c in chunk.choices if c.finish_reason)
            else:
                response = await create(model=self.model, extra_body=extra, **params)
                reasons = {c.index: c.finish_reason for c in response.choices}
        except Exception as exc:  # noqa: BLE001 - every failure is an outcome
            return _failure(kind, exc, t_send)
        if len(reasons) != n:
            return Outcome(kind, "transport_error", 200, None, t_send, time.monotonic(),
                           f"finish reasons for {sorted(reasons)} of {n} choices")
        distinct = set(reasons.values())
        return Outcome(kind, "ok", 200, distinct.pop() if len(distinct) == 1 else "mixed", t_send, time.monotonic())

    async def _cut_stream(self, rng: random.Random) -> Outcome:
        chat = rng.random() < 0.5
        create = self.openai.chat.completions.create if chat else self.openai.completions.create
        keep = rng.randint(2, 4)
        self.cuts_in_flight += 1
        t_send = time.monotonic()
        try:
            response = await create(model=self.model, stream=True, max_tokens=1800, extra_body={"ignore_eos": True},
                                    **self._prompt(rng, chat, 5))
            finished = None
            async with response:  # leaving it closes the connection: the server aborts the request
                async for chunk in response:
                    finished = next((c.finish_reason for c in chunk.choices if c.finish_reason), finished)
                    keep -= bool(chunk.choices)
                    if finished or keep <= 0:
                        break
        except Exception as exc:  # noqa: BLE001
            return _failure("cut", exc, t_send)
        finally:
            self.cuts_in_flight -= 1
            self.last_cut_end = time.monotonic()
        if finished:  # it ended before the cut (not expected at 1800 tokens): counted as it ended
            return Outcome("cut", "ok", 200, finished, t_send, time.monotonic())
        return Outcome("cut", "cut", 200, "abort", t_send, time.monotonic())

    async def _hostile(self, h: Hostile) -> Outcome:
        kind = f"hostile:{h.name}"
        kwargs: dict = {"headers": {"Content-Type": "application/json"}}
        if isinstance(h.body, dict):
            kwargs["json"] = h.body
        elif h.body is not None:
            kwargs["content"] = h.body() if callable(h.body) else h.body
        t_send = time.monotonic()
        try:
            r = await self.http.request(h.method, h.path, **kwargs)
        except httpx.HTTPError as exc:
            return Outcome(kind, "transport_error", None, None, t_send, time.monotonic(), f"{type(exc).__name__}: {exc}")
        result = "http_error" if r.status_code >= 400 else "accepted"  # accepted: a failure of the server
        return Outcome(kind, result, r.status_code, None, t_send, time.monotonic(), r.text[:300])


def _failure(kind: str, exc: Exception, t_send: float) -> Outcome:
    now = time.monotonic()
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        counted = "error" if status >= 500 and _counted_as_error(status, exc.message) else None
        return Outcome(kind, "http_error", status, counted, t_send, now, exc.message[:300])
    if isinstance(exc, openai.APIConnectionError):
        return Outcome(kind, "transport_error", None, None, t_send, now, f"{type(exc).__name__}: {exc.__cause__!r}")
    if isinstance(exc, openai.APIError):  # an error event in a stream: the request failed on the server
        body = exc.body if isinstance(exc.body, dict) else {}
        status = body.get("code") if isinstance(body.get("code"), int) else 500
        return Outcome(kind, "stream_error", status, "error", t_send, now, exc.message[:300])
    return Outcome(kind, "transport_error", None, None, t_send, now, f"{type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- trace backend

def _backend_main(port: int, spans, ready) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_llm.collector.receiver.otlp_http import OtlpReceiver, OtlpReceiverConfig, Signal

    def sink(sig: Signal, payload: bytes) -> None:
        if sig is Signal.TRACES:
            request = ExportTraceServiceRequest.FromString(payload)
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            with spans.get_lock():
                spans.value += n

    with OtlpReceiver(sink, OtlpReceiverConfig(port=port)):
        ready.set()
        signal.pause()


class TraceBackend:
    """An OTLP/HTTP trace receiver in a process of its own on a fixed port, so that `stop()`
    takes it down the hard way (process killed: connections reset, the port refuses) and
    `start()` brings it back on the same port. Spans received are counted across restarts."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/v1/traces"
        self._ctx = mp.get_context("spawn")
        self._spans = self._ctx.Value("q", 0)
        self._proc = None
        self.outages = 0

    @property
    def up(self) -> bool:
        return self._proc is not None

    @property
    def spans_received(self) -> int:
        return self._spans.value

    def start(self) -> None:
        ready = self._ctx.Event()
        self._proc = self._ctx.Process(target=_backend_main, args=(self.port, self._spans, ready), daemon=True)
        self._proc.start()
        if not ready.wait(60):
            self.stop()
            raise RuntimeError(f"the trace backend did not start on port {self.port}")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            self._proc = None

    async def flap(self, schedule: Schedule, t0: float, deadline: float) -> None:
        """Down for the second half of every `outage_period_s`, up again at its end."""
        period = schedule.outage_period_s
        k = 0
        while True:
            for at, change in ((k + 0.5) * period, self.stop), ((k + 1) * period, self.start):
                delay = t0 + at - time.monotonic()
                if t0 + at >= deadline:
                    return
                await asyncio.sleep(max(0.0, delay))
                await asyncio.to_thread(change)
                self.outages += change == self.stop
                log(f"trace backend {'up' if self.up else 'down'}")
            k += 1


# --------------------------------------------------------------------------- server watchers

def rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _engine_pid(api_pid: int) -> int | None:
    pids = engine_pids(api_pid)
    return pids[0] if len(pids) == 1 else None


class MetricsWatch:
    """Scrapes `/metrics`: every scrape must parse, and no monotonic sample (counters, histogram
    counts, sums and buckets) may go below its last value."""

    def __init__(self, url: str):
        self.url = url
        self.ok = self.failed = 0
        self.errors: list[str] = []
        self.backwards: list[dict] = []
        self.last: dict = {}

    async def scrape(self) -> dict | None:
        try:
            samples = await asyncio.to_thread(scrape, self.url)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            self.failed += 1
            self.errors = (self.errors + [f"{type(exc).__name__}: {exc}"[:200]])[-5:]
            return None
        self.ok += 1
        for name, series in samples.items():
            if not name.endswith(_MONOTONIC_SUFFIXES):
                continue
            for labels, value in series.items():
                before = self.last.get((name, labels))
                if before is not None and value < before and len(self.backwards) < 20:
                    self.backwards.append({"sample": name, "labels": dict(labels), "from": before, "to": value})
                self.last[(name, labels)] = value
        return samples

    async def run(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            await self.scrape()
            await asyncio.sleep(1.0)


def success_counts(samples: dict) -> dict[str, int]:
    series = samples.get("vllm:request_success_total", {})
    out = {dict(labels)["finished_reason"]: int(v) for labels, v in series.items()}
    return {reason: out.get(reason, 0) for reason in sorted(set(out) | set(REASONS))}


def _sample(samples: dict, name: str) -> float:
    return sum(samples.get(name, {}).values())


class EngineKill:
    """Kills the engine at `kill_at_s` (once no cut stream is in flight or just cut) and watches
    `/health` until the server says "ok" with a restart counted."""

    def __init__(self, url: str, api_pid: int):
        self.url = url
        self.api_pid = api_pid
        self.killed_s: float | None = None  # monotonic
        self.restarted_s: float | None = None  # first /health "ok" after the kill
        self.statuses_seen: list[str] = []
        self.new_pid: int | None = None

    async def run(self, load: Load, at: float) -> None:
        await asyncio.sleep(max(0.0, at - 2.0 - time.monotonic()))
        load.hold_cuts = True
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        quiet_by = time.monotonic() + 10
        while (load.cuts_in_flight or time.monotonic() - load.last_cut_end < 1.0) and time.monotonic() < quiet_by:
            await asyncio.sleep(0.05)
        pid = _engine_pid(self.api_pid)
        if pid is None:
            log("no engine process to kill")
            return
        os.kill(pid, signal.SIGKILL)
        self.killed_s = time.monotonic()
        log(f"killed the engine (pid {pid})")
        async with httpx.AsyncClient(timeout=10) as http:
            while time.monotonic() - self.killed_s < 300:
                try:
                    body = (await http.get(f"{self.url}/health")).json()
                except (httpx.HTTPError, ValueError):
                    body = {"status": "unanswered"}
                if not self.statuses_seen or self.statuses_seen[-1] != body["status"]:
                    self.statuses_seen.append(body["status"])
                if body["status"] == "ok" and body.get("engine_restarts", 0) >= 1:
                    self.restarted_s = time.monotonic()
                    break
                await asyncio.sleep(0.1)
        load.hold_cuts = False
        self.new_pid = _engine_pid(self.api_pid)
        log(f"engine back after {self.restarted_s - self.killed_s:.1f} s (pid {self.new_pid}); /health said "
            f"{' -> '.join(self.statuses_seen)}" if self.restarted_s else "the engine did not come back")


# --------------------------------------------------------------------------- the run

async def _progress(load: Load, watch: MetricsWatch, backend: TraceBackend, api_pid: int, t0: float,
                    deadline: float) -> None:
    while time.monotonic() < deadline:
        await asyncio.sleep(10.0)
        c = Counter(o.result for o in load.outcomes)
        log(f"t={time.monotonic() - t0:.0f}s requests={len(load.outcomes)} {dict(sorted(c.items()))} "
            f"backend={'up' if backend.up else 'down'} scrapes={watch.ok} failed={watch.failed} "
            f"rss_mb api={rss_mb(api_pid)} engine={rss_mb(_engine_pid(api_pid))}")


async def _rss_series(api_pid: int, t0: float, every_s: float, deadline: float) -> dict:
    """RSS of the API and engine processes every `every_s` of the load (None: no engine then)."""
    series: dict = {"t_s": [], "api": [], "engine": []}
    k = 1
    while t0 + k * every_s <= deadline:
        await asyncio.sleep(max(0.0, t0 + k * every_s - time.monotonic()))
        for key, value in (("t_s", round(k * every_s)), ("api", rss_mb(api_pid)),
                           ("engine", rss_mb(_engine_pid(api_pid)))):
            series[key].append(value)
        k += 1
    return series


async def _at(when: float, fn) -> object:
    await asyncio.sleep(max(0.0, when - time.monotonic()))
    return fn()


async def _settle(watch: MetricsWatch, url: str, timeout_s: float = 60.0) -> dict:
    """The last scrape once nothing runs or waits, the span queue is empty and the counts stopped
    changing (two scrapes a second apart agree)."""
    deadline = time.monotonic() + timeout_s
    previous = None
    samples: dict = {}
    while time.monotonic() < deadline:
        samples = await watch.scrape() or {}
        busy = (_sample(samples, "vllm:num_requests_running") + _sample(samples, "vllm:num_requests_waiting")
                + _sample(samples, "otel_llm_exporter_queue_size"))
        counts = success_counts(samples)
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                health = (await http.get(f"{url}/health")).json()
        except (httpx.HTTPError, ValueError):
            health = {}
        if busy == 0 and counts == previous and health.get("status") == "ok" and health.get("in_flight") == 0:
            return samples
        previous = counts
        await asyncio.sleep(1.0)
    log("WARNING: the server's counters did not settle")
    return samples


async def soak(server: ManagedServer, backend: TraceBackend, schedule: Schedule, concurrency: int, seed: int) -> dict:
    url, api_pid = server.url, server.proc.pid
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    watch = MetricsWatch(url)
    baseline = success_counts(await watch.scrape() or {})
    load = Load(url, model)
    kill = EngineKill(url, api_pid)
    rss = {"start": {"api": rss_mb(api_pid), "engine": rss_mb(_engine_pid(api_pid))}}
    t0 = time.monotonic()
    deadline = t0 + schedule.duration_s

    def sample_rss(key: str) -> None:
        rss[key] = {"api": rss_mb(api_pid), "engine": rss_mb(_engine_pid(api_pid))}

    async def rss_after_restart() -> None:
        while kill.restarted_s is None and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        if kill.restarted_s is not None and kill.restarted_s + schedule.first_minute_s < deadline:
            await _at(kill.restarted_s + schedule.first_minute_s, lambda: sample_rss("after_restart_plus_first_minute"))

    log(f"load for {schedule.duration_s:g} s, {concurrency} workers, engine kill at {schedule.kill_at_s:g} s")
    tasks = [asyncio.create_task(t) for t in (
        watch.run(deadline), backend.flap(schedule, t0, deadline), kill.run(load, t0 + schedule.kill_at_s),
        _progress(load, watch, backend, api_pid, t0, deadline),
        _at(t0 + schedule.first_minute_s, lambda: sample_rss("after_first_minute")), rss_after_restart())]
    series = asyncio.create_task(_rss_series(api_pid, t0, schedule.duration_s / 20, deadline))
    await asyncio.gather(*(load.worker(seed * 1000 + i, deadline) for i in range(concurrency)))
    sample_rss("end")
    load_s = time.monotonic() - t0
    await asyncio.gather(*tasks)
    rss["series"] = await series
    await load.aclose()
    if not backend.up:
        await asyncio.to_thread(backend.start)  # so the span queue can drain
    final = await _settle(watch, url)

    server_counts = {k: v - baseline.get(k, 0) for k, v in success_counts(final).items()}
    client_counts = Counter(o.counted_as for o in load.outcomes if o.counted_as in REASONS)
    client_counts = {reason: client_counts[reason] for reason in server_counts}
    requests = request_summary(load.outcomes, kill.killed_s, kill.restarted_s)
    hostile = [o for o in load.outcomes if o.kind.startswith("hostile:")]
    expected = {h.name: h.expected for h in load.hostile}
    restarts = int(_sample(final, "otel_llm_engine_restarts_total"))
    api_growth = _growth(rss.get("after_first_minute", {}).get("api"), rss["end"]["api"])
    engine_growth = _growth(rss.get("after_restart_plus_first_minute", {}).get("engine"), rss["end"]["engine"])
    return {
        "duration_s": round(load_s, 1),
        "concurrency": concurrency,
        "requests": requests,
        "server_request_success": server_counts,
        "client_observed": client_counts,
        "counts_exact": server_counts == client_counts,
        "hostile": {
            "sent": len(hostile),
            "by_status": dict(sorted(Counter(str(o.status) for o in hostile).items())),
            "not_4xx": _examples([o for o in hostile if not (o.status and 400 <= o.status < 500)]),
            "unexpected_status": _examples([o for o in hostile if o.status != expected[o.kind[8:]]]),
        },
        "failures_outside_restart": _examples([o for o in load.outcomes
                                               if classify(o, kill.killed_s, kill.restarted_s)
                                               in ("5xx_otherwise", "transport_error")]),
        "rss_mb": rss,
        "first_minute_s": schedule.first_minute_s,
        "rss_growth_after_first_minute_pct": {"api": api_growth, "engine_after_restart": engine_growth},
        "engine_restarts": restarts,
        "restart": {
            "killed_at_s": kill.killed_s and round(kill.killed_s - t0, 1),
            "back_after_s": kill.restarted_s and kill.killed_s and round(kill.restarted_s - kill.killed_s, 2),
            "health_statuses": kill.statuses_seen,
            "engine_pid_changed": kill.new_pid is not None and kill.new_pid != server.pids.get("engine"),
        },
        "span_export": {
            **{k: int(_sample(final, f"otel_llm_exporter_{k}_spans_total")) for k in ("sent", "send_failed",
                                                                                      "enqueue_failed")},
            "queue_size": int(_sample(final, "otel_llm_exporter_queue_size")),
            "backend_received": backend.spans_received,
            "backend_outages": backend.outages,
        },
        "telemetry_dropped": int(_sample(final, "otel_llm_telemetry_dropped_total")),
        "metrics_scrapes": {"ok": watch.ok, "failed": watch.failed, "errors": watch.errors,
                            "counters_backwards": watch.backwards},
        "targets": {
            "counts_exact": server_counts == client_counts,
            "api_rss_growth_after_first_minute_lt_5pct": api_growth is not None and api_growth < 5.0,
            "no_5xx_outside_restart": requests["5xx_otherwise"] == 0 and requests["transport_errors"] == 0,
            "hostile_all_4xx": all(o.status and 400 <= o.status < 500 for o in hostile),
            "metrics_parse_and_never_go_backwards": watch.failed == 0 and not watch.backwards,
            "engine_restarted_once": restarts == 1,
        },
    }


def _growth(before: float | None, after: float | None) -> float | None:
    return round((after - before) / before * 100, 2) if before and after else None


def _examples(outcomes: list[Outcome], limit: int = 5) -> dict:
    """How many, by kind and status, with a few messages."""
    return {"count": len(outcomes),
            "by_kind": dict(Counter(f"{o.kind} {o.result} {o.status}" for o in outcomes).most_common(10)),
            "messages": [o.message for o in outcomes[:limit]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    length = p.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=None, help="load duration (default 10)")
    length.add_argument("--seconds", type=float, default=None, help="load duration in seconds (tests)")
    p.add_argument("--concurrency", type=int, default=8, help="workers, one request in flight each")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    duration = args.seconds if args.seconds is not None else 60 * (args.minutes if args.minutes is not None else 10)
    if not duration > 0 or args.concurrency < 1:
        raise SystemExit("soak: error: the duration must be > 0 and --concurrency >= 1")
    schedule = Schedule.for_duration(duration)
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "500"  # spans leave every 0.5 s: the outages are felt at once
    backend = TraceBackend()
    backend.start()
    server = None
    try:
        server = ManagedServer("dummy", True, backend.endpoint, None, ["--max-request-bytes", str(MAX_REQUEST_BYTES)])
        server.wait_ready()
        report = asyncio.run(soak(server, backend, schedule, args.concurrency, args.seed))
    finally:
        if server is not None:
            server.stop()
        backend.stop()
    report["server_log"] = server.logfile.name
    report["passed"] = all(report["targets"].values())
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
