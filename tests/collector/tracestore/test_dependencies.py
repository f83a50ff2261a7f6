"""Service dependencies counted as spans are stored: in whatever order parent and child spans come,
once per span however often it is delivered, per minute, across services only; rebuilt from the
spans of a store written before the table existed. (Jaeger's `/api/dependencies`: test_jaeger_query.)"""

from __future__ import annotations

import sqlite3

from opentelemetry.proto.trace.v1 import trace_pb2

from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
from tests.collector.tracestore.test_store import T0_NS, add, llm_spans, request, sid, tid

CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
WINDOW = (T0_NS // 1000 - 3600_000_000, T0_NS // 1000 + 3600_000_000)


def gateway_call(n: int, start_ns: int) -> tuple[trace_pb2.Span, list[trace_pb2.Span]]:
    """A gateway's client span and the llm server's request tree under it (trace n)."""
    client = trace_pb2.Span(trace_id=tid(n), span_id=sid(n, 9), name="POST upstream", kind=CLIENT,
                            start_time_unix_nano=start_ns - 10_000, end_time_unix_nano=start_ns + 10**9)
    tree = llm_spans(n, start_ns)
    tree[0].parent_span_id = sid(n, 9)
    return client, tree


def test_parent_and_child_in_any_order_count_one_call_each(tmp_path):
    store = TraceStore(TraceStoreConfig(str(tmp_path)))
    try:
        client, tree = gateway_call(1, T0_NS)  # the child (server tree) first, its parent later
        add(store, request(tree))
        assert store.dependencies(*WINDOW) == []
        add(store, request([client], service="gateway"))
        assert store.dependencies(*WINDOW) == [("gateway", "llm", 1)]
        client, tree = gateway_call(2, T0_NS + 10**9)  # the parent first
        add(store, request([client], service="gateway"))
        add(store, request(tree))
        client, tree = gateway_call(3, T0_NS + 2 * 10**9)  # both in one export
        req = request(tree)
        req.resource_spans.extend(request([client], service="gateway").resource_spans)
        add(store, req)
        add(store, req)  # delivered again (OTLP is at least once): the same calls, not new ones
        add(store, request(gateway_call(2, T0_NS + 10**9)[1]))
        assert store.dependencies(*WINDOW) == [("gateway", "llm", 3)]  # same-service spans are not calls
        assert store._db.execute("SELECT count(*) FROM pending_links").fetchone() == (0,)
    finally:
        store.close()


def test_the_window_the_service_filter_and_expiry(tmp_path):
    store = TraceStore(TraceStoreConfig(str(tmp_path), retention_s=3600))
    try:
        for n, minute in ((1, 0), (2, 0), (3, 5)):
            client, tree = gateway_call(n, T0_NS + minute * 60 * 10**9)
            add(store, request([client], service="gateway"))
            add(store, request(tree))
        batch = request([trace_pb2.Span(trace_id=tid(4), span_id=sid(4, 1), parent_span_id=sid(4, 9), name="job",
                                        start_time_unix_nano=T0_NS, end_time_unix_nano=T0_NS + 1)], service="worker")
        add(store, batch)  # a parent never seen here: waits, then is dropped
        t0 = T0_NS // 1000
        assert store.dependencies(t0, t0 + 60_000_000) == [("gateway", "llm", 2)]
        assert store.dependencies(t0, t0 + 600_000_000) == [("gateway", "llm", 3)]
        assert store.dependencies(t0 + 120_000_000, t0 + 600_000_000) == [("gateway", "llm", 1)]
        assert store.dependencies(*WINDOW, service="llm") == [("gateway", "llm", 3)]
        assert store.dependencies(*WINDOW, service="worker") == []
        store.enforce_retention(t0 + 3600_000_000 + 200_000_000)  # minute 0 is past the hour's retention
        assert store.dependencies(*WINDOW) == [("gateway", "llm", 1)]
        assert store._db.execute("SELECT count(*) FROM pending_links").fetchone() == (1,)  # the worker's child waits
        store._db.execute("UPDATE pending_links SET created_us = created_us - 601000000")  # 10 minutes on
        store.enforce_retention(t0 + 3600_000_000 + 200_000_000)
        assert store._db.execute("SELECT count(*) FROM pending_links").fetchone() == (0,)
    finally:
        store.close()


def test_a_store_from_before_gets_its_links_from_its_spans(tmp_path):
    store = TraceStore(TraceStoreConfig(str(tmp_path)))
    for n in range(1, 4):
        client, tree = gateway_call(n, T0_NS + n * 10**9)
        add(store, request([client], service="gateway"))
        add(store, request(tree))
    store.close()
    db = sqlite3.connect(tmp_path / "traces.sqlite")
    db.executescript("DROP TABLE dependency_links; DROP TABLE pending_links;")  # as an earlier version wrote it
    db.close()
    store = TraceStore(TraceStoreConfig(str(tmp_path)))
    try:
        assert store.dependencies(*WINDOW) == [("gateway", "llm", 3)]
    finally:
        store.close()
