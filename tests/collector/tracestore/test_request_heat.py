"""The fleet overview (`request_heat`): every stored request in the latency heatmap and the load lane,
equal to a direct computation from the requests themselves; redeliveries counted once; a store from
before it filled at open; retention; a service's share; the HTTP endpoint."""

from __future__ import annotations

import json
import math
import random
import sqlite3
import urllib.error
import urllib.request

import numpy as np
import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_llm.collector.tracestore.request_heat import NO_VALUE, STEP_US, bucket
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
from tests.collector.tracestore.test_store import ERROR, INTERNAL, kvs, request, sid, tid

T0_US = 1_790_000_000_000_000  # a whole 10 s step


def request_span(n: int, start_us: int, ttft: float | None, e2e: float, queue: float, tokens: int,
                 error: str | None = None, preempted: bool = False, **extra) -> trace_pb2.Span:
    attrs = {"gen_ai.latency.e2e": e2e, "gen_ai.latency.time_in_queue": queue, "gen_ai.usage.output_tokens": tokens,
             **extra}
    if ttft is not None:
        attrs["gen_ai.latency.time_to_first_token"] = ttft
        attrs["gen_ai.latency.time_in_model_decode"] = e2e - ttft
    if error:
        attrs["error.type"] = error
    span = trace_pb2.Span(trace_id=tid(n), span_id=sid(n, 1), name="chat m", kind=INTERNAL,
                          start_time_unix_nano=start_us * 1000, end_time_unix_nano=(start_us + int(e2e * 1e6)) * 1000,
                          attributes=kvs(attrs))
    if error:
        span.status.code = ERROR
    if preempted:
        span.events.add(name="preempted", time_unix_nano=start_us * 1000 + 1000)
    return span


def workload(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        queue = rng.expovariate(1 / 0.3)
        failed = rng.random() < 0.05
        ttft = None if failed and rng.random() < 0.5 else queue + rng.lognormvariate(-3, 1)
        tokens = rng.choice([1, rng.randint(2, 400)])
        e2e = (ttft or queue) + tokens * rng.uniform(0.005, 0.05)
        out.append({"n": i + 1, "start_us": T0_US + rng.randrange(0, 600_000_000), "ttft": ttft, "e2e": e2e,
                    "queue": queue, "tokens": tokens, "service": rng.choice(["a", "b"]),
                    "error": ("abort" if rng.random() < 0.5 else "error") if failed else None,
                    "preempted": rng.random() < 0.03})
    return out


def fill(store: TraceStore, reqs: list[dict]) -> None:
    for i in range(0, len(reqs), 50):
        for service in ("a", "b"):
            spans = [request_span(r["n"], r["start_us"], r["ttft"], r["e2e"], r["queue"], r["tokens"], r["error"],
                                  r["preempted"]) for r in reqs[i:i + 50] if r["service"] == service]
            if spans:
                store.add(request(spans, service=service).SerializeToString())


def expected(reqs: list[dict], metric: str, start_us: int, end_us: int, columns: int) -> dict:
    """The heatmap computed directly from the requests (numpy), as `request_heat.heatmap` documents it."""
    t0, t1 = start_us // STEP_US, end_us // STEP_US
    per = max(1, math.ceil((t1 - t0 + 1) / columns))
    cells: dict[tuple, np.ndarray] = {}
    for r in reqs:
        t = r["start_us"] // STEP_US
        if not t0 <= t <= t1:
            continue
        itl = (r["e2e"] - r["ttft"]) / (r["tokens"] - 1) if r["ttft"] is not None and r["tokens"] > 1 else None
        v = {"ttft": r["ttft"], "e2e": r["e2e"], "queue": r["queue"], "itl": itl}[metric]
        key = ((t - t0) // per, bucket(v))
        cells[key] = cells.get(key, np.zeros(4, np.int64)) + (1, r["error"] is not None, r["error"] == "abort",
                                                                  r["preempted"])
    width = per * STEP_US
    load = np.zeros(((t1 - t0) // per + 1, 2))
    for r in reqs:  # the request-seconds waiting and running within each column, whenever the request started
        s = r["start_us"]
        q = s + int(min(r["queue"], r["e2e"]) * 1e6)
        for which, (a, b) in enumerate(((s, q), (q, s + int(r["e2e"] * 1e6)))):
            for col in range(len(load)):
                lo = (t0 + col * per) * STEP_US
                overlap = min(b, lo + width, (t1 + 1) * STEP_US) - max(a, lo)
                if overlap > 0:
                    load[col, which] += overlap / 1e6
    seconds = [min(per, t1 - t0 - x * per + 1) * STEP_US / 1e6 for x in range(len(load))]  # the last: fewer
    return {"cells": sorted([x, b, *map(int, v)] for (x, b), v in cells.items()),
            "load": load / np.array(seconds)[:, None]}


@pytest.fixture
def filled(tmp_path):
    reqs = workload(3000)
    store = TraceStore(TraceStoreConfig(str(tmp_path)))
    fill(store, reqs)
    yield store, reqs
    store.close()


@pytest.mark.parametrize("metric", ["ttft", "e2e", "queue", "itl"])
def test_every_request_is_in_the_heatmap_as_a_direct_computation_has_it(filled, metric):
    store, reqs = filled
    start, end = T0_US + 35_000_000, T0_US + 540_000_000
    got = store.heatmap(metric, start, end, columns=17)
    want = expected(reqs, metric, start, end, 17)
    assert sorted(got["cells"]) == want["cells"]
    assert got["columns"] <= 17 and got["step_us"] % STEP_US == 0 and got["start_us"] == start - start % STEP_US
    in_window = [r for r in reqs if start // STEP_US <= r["start_us"] // STEP_US <= end // STEP_US]
    assert got["requests"] == len(in_window) > 2000
    assert got["no_value"] == sum(c[2] for c in want["cells"] if c[1] == NO_VALUE)
    if metric in ("ttft", "itl"):
        assert got["no_value"] > 0  # failed before a first token; one output token
    # the load lane: mean requests waiting and running in each column (those that started before it included)
    load = np.zeros_like(want["load"])
    for x, waiting, running in got["load"]:
        load[x] = waiting, running
    assert np.allclose(load, want["load"], atol=2e-3)


def test_a_service_alone_and_the_two_together(filled):
    store, reqs = filled
    start, end = T0_US, T0_US + 600_000_000
    both = store.heatmap("e2e", start, end)
    a, b = store.heatmap("e2e", start, end, "a"), store.heatmap("e2e", start, end, "b")
    assert a["requests"] == sum(r["service"] == "a" for r in reqs) and a["requests"] + b["requests"] == both["requests"]
    assert store.heatmap("e2e", start, end, "nobody")["requests"] == 0
    with pytest.raises(ValueError, match="unknown metric 'tpot'"):
        store.heatmap("tpot", start, end)


def test_a_request_delivered_again_is_counted_once(filled):
    store, reqs = filled
    before = store.heatmap("ttft", T0_US, T0_US + 600_000_000)
    fill(store, reqs[:200])  # resent: the spans are stored already
    assert store.heatmap("ttft", T0_US, T0_US + 600_000_000) == before


def test_retention_forgets_the_old_steps(filled):
    store, reqs = filled
    cutoff = T0_US + 300_000_000
    store.enforce_retention(cutoff + int(store.config.retention_s * 1e6))
    got = store.heatmap("e2e", T0_US, T0_US + 600_000_000)
    assert got["requests"] == sum(r["start_us"] // STEP_US >= cutoff // STEP_US for r in reqs)


def test_a_store_from_before_the_overview_is_counted_at_open(tmp_path, filled):
    """A database without the overview's tables and the requests' ITL and preemption columns: opened,
    every stored request is counted (ITL and preemption, which it never stored, as none)."""
    store, reqs = filled
    want = store.heatmap("ttft", T0_US, T0_US + 600_000_000)
    store.close()
    db = sqlite3.connect(store.path)
    with db:
        for table in ("request_heat", "request_load"):
            db.execute(f"DROP TABLE {table}")
        db.execute("CREATE TABLE old AS SELECT id, trace_id, span_id, service_id, operation, start_us, duration_us, "
                   "ttft_s, e2e_s, queue_s, error, error_type, finish_reason FROM requests")
        db.execute("DROP TABLE requests")
        db.execute("ALTER TABLE old RENAME TO requests")
    db.close()
    store = TraceStore(store.config)
    try:
        got = store.heatmap("ttft", T0_US, T0_US + 600_000_000)
        assert [c[:3] for c in got["cells"]] == [c[:3] for c in want["cells"]]
        assert sum(c[5] for c in got["cells"]) == 0  # preemption: not in the old rows
        assert store.heatmap("itl", T0_US, T0_US + 600_000_000)["no_value"] == len(reqs)
    finally:
        store.close()


def get_data(store: TraceStore, path: str):
    """`path` asked of the collector's query API over `store`: the envelope's data."""
    from otel_llm.collector.extension.jaeger_query import JaegerQueryApi

    api = JaegerQueryApi(store, "127.0.0.1", 0)
    api.start()
    try:
        with urllib.request.urlopen(api.url + path) as resp:
            return json.loads(resp.read())["data"]
    finally:
        api.stop()


def test_the_http_endpoint_answers_the_overview(filled):
    store, _ = filled
    path = f"/api/llm/heatmap?start={T0_US}&end={T0_US + 600_000_000}&metric=ttft"
    data = get_data(store, path)
    assert data == json.loads(json.dumps(store.heatmap("ttft", T0_US, T0_US + 600_000_000)))
    with pytest.raises(urllib.error.HTTPError) as bad:
        get_data(store, path.replace("metric=ttft", "metric=tpot"))
    assert bad.value.code == 400 and "unknown metric" in bad.value.read().decode()
