"""Calls, errors and latency per service and operation, counted as spans are stored (Jaeger's Service
Performance Monitoring): rates and fractions exact over each window, quantiles within a bucket of the
true ones, kinds and operations apart, spans delivered again counted once, a store from before
filled from its spans."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_llm.collector.tracestore.span_metrics import BOUNDS_MS, quantile_ms
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
from tests.collector.tracestore.test_store import ERROR, T0_NS, add, request, sid, tid

SERVER = trace_pb2.Span.SPAN_KIND_SERVER
MIN_NS = 60 * 10**9
M0_NS = T0_NS - T0_NS % MIN_NS  # a minute's start


def server_spans(rng, n: int, first: int, minute: int, name: str = "POST /v1/chat/completions", errors: int = 0):
    durations = rng.lognormal(np.log(200.0), 0.8, n)  # ms
    spans = [trace_pb2.Span(trace_id=tid(first + i), span_id=sid(first + i, 1), name=name, kind=SERVER,
                            start_time_unix_nano=M0_NS + minute * MIN_NS + i * 1000,
                            end_time_unix_nano=M0_NS + minute * MIN_NS + i * 1000 + int(d * 1e6),
                            status={"code": ERROR} if i < errors else {})
             for i, d in enumerate(durations)]
    return spans, durations


@pytest.fixture
def filled(tmp_path):
    """llm: 120 calls in minute 0 (6 errors), 60 in minute 1 (none), 30 of another operation in minute 1;
    plus internal spans, which a server-kind query leaves out."""
    rng = np.random.default_rng(7)
    store = TraceStore(TraceStoreConfig(str(tmp_path)))
    a, da = server_spans(rng, 120, 0, 0, errors=6)
    b, db_ = server_spans(rng, 60, 1000, 1)
    c, _ = server_spans(rng, 30, 2000, 1, name="POST /v1/completions")
    internal = [trace_pb2.Span(trace_id=tid(3000), span_id=sid(3000, i), name="queue", start_time_unix_nano=M0_NS,
                               end_time_unix_nano=M0_NS + 10**6) for i in range(1, 9)]
    for spans in (a, b, c, internal):
        add(store, request(spans))
    add(store, request(a[:10]))  # delivered again: not new calls
    yield store, np.concatenate([da, db_])
    store.close()


def query(store, metric, by_operation=False, kinds=(SERVER,), quantile=0.5, step_s=60, rate_s=600, lookback_s=120):
    end_us = M0_NS // 1000 + 2 * 60_000_000 - 1
    return store.span_series(metric, ["llm"], list(kinds), by_operation, end_us, lookback_s * 1_000_000,
                             step_s * 1_000_000, rate_s * 1_000_000, quantile)


def test_calls_and_errors_per_window(filled):
    store, _ = filled
    [(key, calls)] = query(store, "calls").items()
    assert key == ("llm", "")
    rates = [round(v * 600) for _, v in calls]  # per second over the 10-minute window: the calls in it
    assert rates == [0, 120, 210]  # points at end-2min, end-1min, end: minute 0, then minutes 0 and 1
    [(_, errors)] = query(store, "errors").items()
    assert [round(v, 6) for _, v in errors] == [round(6 / 120, 6), round(6 / 210, 6)]  # no calls: no point
    by_op = query(store, "calls", by_operation=True)
    assert sorted(by_op) == [("llm", "POST /v1/chat/completions"), ("llm", "POST /v1/completions")]
    assert round(by_op[("llm", "POST /v1/completions")][-1][1] * 600) == 30
    assert round(query(store, "calls", kinds=(0,))[("llm", "")][-1][1] * 600) == 8  # the unspecified-kind spans
    assert round(query(store, "calls", rate_s=60)[("llm", "")][-1][1] * 60) == 90  # a 1-minute window: minute 1


def test_latency_quantiles_are_within_a_bucket_of_the_true_ones(filled):
    store, durations = filled
    for q in (0.5, 0.75, 0.95, 0.99):
        [(_, points)] = query(store, "latencies", quantile=q).items()
        got, want = points[-1][1], float(np.quantile(durations, q))
        assert abs(got - want) / want < 0.2, (q, got, want)  # buckets 1.2x apart
    assert quantile_ms(np.bincount([3], minlength=len(BOUNDS_MS) + 1), 1.0) == pytest.approx(BOUNDS_MS[3])


def test_a_store_from_before_counts_its_spans_once_opened(filled, tmp_path):
    store, _ = filled
    want = {m: query(store, m) for m in ("calls", "errors", "latencies")}
    store.close()
    db = sqlite3.connect(tmp_path / "traces.sqlite")
    db.execute("DROP TABLE span_minutes")
    db.commit()
    db.close()
    reopened = TraceStore(TraceStoreConfig(str(tmp_path)))
    try:
        assert {m: query(reopened, m) for m in want} == want
    finally:
        reopened.close()


def test_retention_drops_old_minutes(filled):
    store, _ = filled
    store.enforce_retention(M0_NS // 1000 + 24 * 3600_000_000 + 60_000_000)  # minute 0 is past a day
    assert round(query(store, "calls")[("llm", "")][-1][1] * 600) == 90
