"""Baselines for telemetry_overhead.py, doing the same work the way existing code does it.

- `PromClientVllm`: vLLM v1's way: per step, per request output, Python state
  updates and one prometheus_client `observe` per value (pre-bound children),
  counters per step, 13 histogram observes + a counter per finished request,
  one `llm_request` span via `start_span`/`end`.
- `NaiveOtel`: the same with OTel SDK instruments (`record`/`add` with the
  attribute dict) and the span tree (root + queue/prefill/decode + events)
  through `start_span`/`end`.
"""

from __future__ import annotations

import gc
import time

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from otel_llm.canonical import instruments as I

HISTS = {  # name -> buckets, per finished request (besides TTFT/ITL)
    "e2e": I.VLLM_REQUEST_LATENCY, "queue": I.VLLM_REQUEST_LATENCY, "prefill": I.VLLM_REQUEST_LATENCY,
    "decode": I.VLLM_REQUEST_LATENCY, "inference": I.VLLM_REQUEST_LATENCY, "tpot": I.VLLM_ITL,
    "prompt": I._build_1_2_5(8192), "gen": I._build_1_2_5(8192), "max_gen": I._build_1_2_5(8192),
    "n": I.VLLM_PARAMS_N, "max_tokens": I._build_1_2_5(8192), "preempt": I.VLLM_NUM_PREEMPTIONS,
}


class _State:
    __slots__ = ("arrival", "queued", "sched", "first", "last", "ngen", "npre")

    def __init__(self, arrival):
        self.arrival, self.queued, self.sched, self.first, self.last, self.ngen, self.npre = arrival, 0, 0, 0, 0, 0, 0


def _provider():
    from telemetry_overhead import tracer_provider
    return tracer_provider()


class _Path:
    """Shared driver: the same lifecycle as otel_llm's benchmark, with per-value calls."""

    def __init__(self, concurrency: int):
        self.c = concurrency

    def token_path(self, steps: int) -> float:
        states = [_State(time.monotonic()) for _ in range(self.c)]
        now = time.monotonic()
        for s in states:
            s.first = s.last = now
        gc.collect()
        t0 = time.perf_counter_ns()
        for _ in range(steps):
            ts = time.monotonic()
            n = 0
            for s in states:  # vLLM's OutputProcessor: one Python update per request output
                self.itl(ts - s.last)
                s.last = ts
                s.ngen += 1
                n += 1
            self.step(n)
        return (time.perf_counter_ns() - t0) / (steps * self.c)

    def request_path(self, rounds: int):
        tp, exporter = _provider()
        self.tracer = tp.get_tracer("baseline")
        gc.collect()
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            states = [_State(time.monotonic()) for _ in range(self.c)]
            for s in states:
                s.queued = time.monotonic()
            for i, s in enumerate(states):
                s.sched = time.monotonic()
                if i % 8 == 0:
                    s.npre += 1
            ts = time.monotonic()
            for s in states:
                s.first = s.last = ts
                s.ngen = 1
                self.first_token(ts - s.arrival, 512)
            ts = time.monotonic()
            for s in states:
                self.itl(ts - s.last)
                s.last = ts
                s.ngen += 1
            for s in states:
                self.finish(s, time.monotonic())
        tp.force_flush()
        elapsed = (time.perf_counter_ns() - t0) / (rounds * self.c) / 1000
        spans = len(exporter.get_finished_spans())
        tp.shutdown()
        return elapsed if isinstance(self, PromClientVllm) else (elapsed, spans)

    def _values(self, s: _State, now: float) -> dict:
        return {"e2e": now - s.arrival, "queue": s.sched - s.queued, "prefill": s.first - s.sched,
                "decode": s.last - s.first, "inference": s.last - s.sched,
                "tpot": (s.last - s.first) / max(s.ngen - 1, 1), "prompt": 512, "gen": s.ngen, "max_gen": s.ngen,
                "n": 1, "max_tokens": 256, "preempt": s.npre}


class PromClientVllm(_Path):
    def __init__(self, concurrency: int):
        super().__init__(concurrency)
        reg = CollectorRegistry()
        labels = ["model_name", "engine"]
        mk = lambda name, b: Histogram(name, name, labels, buckets=b, registry=reg).labels("bench", "0")  # noqa: E731
        self._itl = mk("vllm:inter_token_latency_seconds", I.VLLM_ITL)
        self._ttft = mk("vllm:time_to_first_token_seconds", I.VLLM_TTFT)
        self._iter = mk("vllm:iteration_tokens_total", I.VLLM_ITERATION_TOKENS)
        self._gen = Counter("vllm:generation_tokens", "", labels, registry=reg).labels("bench", "0")
        self._prompt = Counter("vllm:prompt_tokens", "", labels, registry=reg).labels("bench", "0")
        self._success = Counter("vllm:request_success", "", labels + ["finished_reason"], registry=reg).labels("bench", "0", "stop")
        self._h = {k: mk(f"vllm:{k}", b) for k, b in HISTS.items()}

    def itl(self, v):
        self._itl.observe(v)

    def step(self, n):
        self._gen.inc(n)
        self._iter.observe(n)

    def first_token(self, ttft, prompt):
        self._ttft.observe(ttft)
        self._prompt.inc(prompt)

    def finish(self, s, now):
        for k, v in self._values(s, now).items():
            self._h[k].observe(v)
        self._success.inc()
        span = self.tracer.start_span("llm_request", kind=trace.SpanKind.SERVER, start_time=int(s.arrival * 1e9))
        span.set_attributes({"gen_ai.request.id": "x", "gen_ai.usage.prompt_tokens": 512,
                             "gen_ai.usage.completion_tokens": s.ngen, "gen_ai.latency.time_in_queue": s.sched - s.queued,
                             "gen_ai.latency.time_to_first_token": s.first - s.arrival, "gen_ai.latency.e2e": now - s.arrival,
                             "gen_ai.latency.time_in_model_prefill": s.first - s.sched,
                             "gen_ai.latency.time_in_model_decode": s.last - s.first,
                             "gen_ai.latency.time_in_model_inference": s.last - s.sched,
                             "gen_ai.request.max_tokens": 256, "gen_ai.request.temperature": 0.7})
        span.end()


class NaiveOtel(_Path):
    def __init__(self, concurrency: int):
        super().__init__(concurrency)
        self.reader = InMemoryMetricReader()
        meter = MeterProvider(metric_readers=[self.reader]).get_meter("naive")
        mk = lambda name, b: meter.create_histogram(name, "s", explicit_bucket_boundaries_advisory=b)  # noqa: E731
        self.attrs = {"gen_ai.request.model": "bench", "otel_llm.engine": "0"}
        self._itl = mk("itl", I.VLLM_ITL)
        self._ttft = mk("ttft", I.VLLM_TTFT)
        self._iter = mk("iter", I.VLLM_ITERATION_TOKENS)
        self._gen = meter.create_counter("gen")
        self._prompt = meter.create_counter("prompt")
        self._success = meter.create_counter("success")
        self._h = {k: mk(k, b) for k, b in HISTS.items()}

    def itl(self, v):
        self._itl.record(v, self.attrs)

    def step(self, n):
        self._gen.add(n, self.attrs)
        self._iter.record(n, self.attrs)

    def first_token(self, ttft, prompt):
        self._ttft.record(ttft, self.attrs)
        self._prompt.add(prompt, self.attrs)

    def finish(self, s, now):
        for k, v in self._values(s, now).items():
            self._h[k].record(v, self.attrs)
        self._success.add(1, {**self.attrs, "finished_reason": "stop"})
        ns = lambda t: int(t * 1e9)  # noqa: E731
        root = self.tracer.start_span("chat bench", kind=trace.SpanKind.SERVER, start_time=ns(s.arrival),
                                      attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "bench",
                                                  "gen_ai.usage.input_tokens": 512, "gen_ai.usage.output_tokens": s.ngen,
                                                  "gen_ai.latency.e2e": now - s.arrival,
                                                  "gen_ai.latency.time_in_queue": s.sched - s.queued,
                                                  "gen_ai.request.max_tokens": 256, "gen_ai.request.temperature": 0.7,
                                                  "gen_ai.response.finish_reasons": ("stop",), "gen_ai.response.id": "x"})
        ctx = trace.set_span_in_context(root)
        for name, a, b in (("queue", s.queued, s.sched), ("prefill", s.sched, s.first), ("decode", s.first, s.last)):
            self.tracer.start_span(name, ctx, start_time=ns(a), attributes={"gen_ai.operation.name": "chat"}).end(ns(b))
        root.add_event("first_token", timestamp=ns(s.first))
        root.end(ns(now))


def prometheus_client_exposition(engines: int, reps: int) -> tuple[float, int]:
    """prometheus_client generate_latest for the same families x engines."""
    import statistics
    reg = CollectorRegistry()
    fams = {"ttft": I.VLLM_TTFT, "itl": I.VLLM_ITL, "iter": I.VLLM_ITERATION_TOKENS, **HISTS}
    hists = [Histogram(f"vllm:{k}", k, ["model_name", "engine"], buckets=b, registry=reg) for k, b in fams.items()]
    counters = [Counter(f"vllm:c{i}", "c", ["model_name", "engine"], registry=reg) for i in range(8)]
    for e in range(engines):
        for h in hists:
            child = h.labels("bench", str(e))
            for v in (0.01, 0.5, 3.0, 100.0):
                child.observe(v)
        for c in counters:
            c.labels("bench", str(e)).inc()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        body = generate_latest(reg)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times), body.count(b"\n")
