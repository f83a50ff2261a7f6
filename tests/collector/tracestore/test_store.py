"""The trace store: what goes in comes back whole, Jaeger's search semantics, the LLM request
queries, retention by age and by size, malformed input, a writer racing readers, a span stored
again kept once, and a database from before that was upgraded at open."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_llm.collector.tracestore.query import TraceQuery
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig

SERVER, INTERNAL = trace_pb2.Span.SPAN_KIND_SERVER, trace_pb2.Span.SPAN_KIND_INTERNAL
ERROR = trace_pb2.Status.STATUS_CODE_ERROR
T0_NS = 1_790_000_000_000_000_000  # 2026-09-21, whole µs
# Two `llm_request` spans real vLLM 0.32 (CPU build) exported (trace id, span id, start, end, attributes).
VLLM_SPANS = [
    ("ca71e1ba843642c0125f5cf15ed55705", "5dbc42c1f8c549bd", 1795418369434936064, 1795418369536827498, {
        "gen_ai.latency.e2e": 0.1012427806854248, "gen_ai.latency.time_in_model_decode": 0.07605417699960526,
        "gen_ai.latency.time_in_model_inference": 0.09277008499975636,
        "gen_ai.latency.time_in_model_prefill": 0.016715908000151103,
        "gen_ai.latency.time_in_queue": 4.1512000279908534e-05,
        "gen_ai.latency.time_to_first_token": 0.030458688735961914, "gen_ai.request.id": "cmpl-b8c30142c0fca07e-0",
        "gen_ai.request.max_tokens": 16, "gen_ai.request.n": 1, "gen_ai.request.top_p": 1.0,
        "gen_ai.usage.completion_tokens": 16, "gen_ai.usage.prompt_tokens": 13}),
    ("cb44d4ea3459c624ac401d778bdb153e", "9561929d40d3f137", 1795418369541870336, 1795418369656232768, {
        "gen_ai.latency.e2e": 0.11390805244445801, "gen_ai.latency.time_in_model_decode": 0.09764976899987232,
        "gen_ai.latency.time_in_model_inference": 0.11105596299967146,
        "gen_ai.latency.time_in_model_prefill": 0.013406193999799143,
        "gen_ai.latency.time_in_queue": 2.793200019368669e-05,
        "gen_ai.latency.time_to_first_token": 0.01636791229248047, "gen_ai.request.id": "cmpl-97f74f89aabdcc65-0",
        "gen_ai.request.max_tokens": 24, "gen_ai.request.n": 1, "gen_ai.request.temperature": 0.8,
        "gen_ai.request.top_p": 1.0, "gen_ai.usage.completion_tokens": 24, "gen_ai.usage.prompt_tokens": 14}),
]


def value(v) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, bytes):
        return AnyValue(bytes_value=v)
    if isinstance(v, (list, tuple)):
        return AnyValue(array_value={"values": [value(x) for x in v]})
    if isinstance(v, dict):
        return AnyValue(kvlist_value={"values": kvs(v)})
    return AnyValue(string_value=v)


def kvs(attrs: dict) -> list[KeyValue]:
    return [KeyValue(key=k, value=value(v)) for k, v in attrs.items()]


def tid(n: int) -> bytes:
    return (n | (0xABC << 64)).to_bytes(16, "big")  # high half non-zero: 32-hex Jaeger ids


def sid(trace: int, i: int) -> bytes:
    return (trace << 8 | i).to_bytes(8, "big")


def request(spans: list[trace_pb2.Span], service: str = "llm", scope: str = "otel_llm",
            **resource) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add(resource={"attributes": kvs({"service.name": service, **resource})})
    rs.scope_spans.add(scope={"name": scope, "version": "0.1.0"}, spans=spans)
    return req


def llm_spans(n: int, start_ns: int, ttft_s: float = 0.05, e2e_s: float = 0.5, queue_s: float = 0.01,
              error: str | None = None, model: str = "m", trace_id: bytes | None = None) -> list[trace_pb2.Span]:
    """One request's tree, as otel_llm emits it: HTTP SERVER span > `chat {model}` > queue/prefill/decode."""
    trace_id = trace_id or tid(n)
    end_ns = start_ns + int(e2e_s * 1e9)
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model, "gen_ai.usage.input_tokens": 12,
             "gen_ai.response.finish_reasons": [error or "stop"], "gen_ai.latency.time_to_first_token": ttft_s,
             "gen_ai.latency.e2e": e2e_s, "gen_ai.latency.time_in_queue": queue_s,
             "gen_ai.latency.time_in_model_prefill": ttft_s - queue_s, "gen_ai.latency.time_in_model_decode": e2e_s - ttft_s}
    status = {}
    if error:
        attrs["error.type"] = error
        status = {"code": ERROR, "message": f"request finished with {error}"}
    first = start_ns + int(ttft_s * 1e9)
    return [
        trace_pb2.Span(trace_id=trace_id, span_id=sid(n, 1), name="POST /v1/chat/completions", kind=SERVER,
                       start_time_unix_nano=start_ns - 1000, end_time_unix_nano=end_ns + 1000,
                       attributes=kvs({"http.request.method": "POST", "http.response.status_code": 200})),
        trace_pb2.Span(trace_id=trace_id, span_id=sid(n, 2), parent_span_id=sid(n, 1), name=f"chat {model}",
                       kind=INTERNAL, start_time_unix_nano=start_ns, end_time_unix_nano=end_ns, attributes=kvs(attrs),
                       events=[{"name": "first_token", "time_unix_nano": first}], status=status),
        *(trace_pb2.Span(trace_id=trace_id, span_id=sid(n, 3 + i), parent_span_id=sid(n, 2), name=name, kind=INTERNAL,
                         start_time_unix_nano=t0, end_time_unix_nano=t1, attributes=kvs({"gen_ai.operation.name": "chat"}))
          for i, (name, t0, t1) in enumerate((("queue", start_ns, start_ns + int(queue_s * 1e9)),
                                              ("prefill", start_ns + int(queue_s * 1e9), first),
                                              ("decode", first, end_ns))))]


def add(store: TraceStore, req: ExportTraceServiceRequest) -> int:
    return store.add(req.SerializeToString())


@pytest.fixture
def store(tmp_path):
    s = TraceStore(TraceStoreConfig(str(tmp_path / "traces")))
    yield s
    s.close()


def test_config_names_the_bad_value(tmp_path):
    with pytest.raises(ValueError, match="''"):
        TraceStoreConfig("")
    with pytest.raises(ValueError, match="-1"):
        TraceStoreConfig(str(tmp_path), retention_s=-1)
    with pytest.raises(ValueError, match="1000"):
        TraceStoreConfig(str(tmp_path), max_bytes=1000)
    with pytest.raises(ValueError, match="service"):
        TraceQuery("")
    with pytest.raises(ValueError, match="0"):
        TraceQuery("s", limit=0)
    with pytest.raises(ValueError, match="maxDuration"):
        TraceQuery("s", min_duration_us=10, max_duration_us=5)


def test_a_trace_comes_back_as_it_was_sent(store):
    spans = llm_spans(1, T0_NS)
    spans[1].links.add(trace_id=tid(9), span_id=sid(9, 1), attributes=kvs({"k": "v"}))
    spans[1].trace_state = "vendor=x"
    sent = request(spans, **{"service.instance.id": "i-1"})
    assert add(store, sent) == 5
    got = store.trace(tid(1).hex())
    assert [s.span for s in got] == sorted(spans, key=lambda s: s.start_time_unix_nano)
    assert all(s.resource == sent.resource_spans[0].resource for s in got)
    assert all(s.scope == sent.resource_spans[0].scope_spans[0].scope for s in got)
    assert store.trace("ffff") == [] and store.trace(tid(2).hex()) == []
    with pytest.raises(ValueError, match="xyz"):
        store.trace("xyz")


def test_short_trace_ids_are_left_padded(store):
    spans = llm_spans(1, T0_NS, trace_id=(0x1234).to_bytes(16, "big"))
    add(store, request(spans))
    assert len(store.trace("1234")) == len(store.trace("0000000000001234")) == len(store.trace("0" * 28 + "1234")) == 5


def test_malformed_requests_store_nothing(store):
    with pytest.raises(ValueError, match="malformed"):
        store.add(b"\xff\xff\xff")
    bad = llm_spans(2, T0_NS)
    bad[3].span_id = b"\x01\x02"
    with pytest.raises(ValueError, match="0102"):
        add(store, request(llm_spans(1, T0_NS) + bad))
    with pytest.raises(ValueError, match="trace_id"):
        add(store, request([trace_pb2.Span(trace_id=bytes(16), span_id=sid(1, 1), name="x")]))
    assert store.services() == [] and store.trace(tid(1).hex()) == []
    assert add(store, request(llm_spans(1, T0_NS))) == 5  # the store still works


def test_services_and_operations(store):
    add(store, request(llm_spans(1, T0_NS), service="b"))
    add(store, request(llm_spans(2, T0_NS, model="x"), service="a"))
    assert store.services() == ["a", "b"]
    assert [(o.name, o.span_kind) for o in store.operations("b")] == [
        ("POST /v1/chat/completions", "server"), ("chat m", "internal"), ("decode", "internal"),
        ("prefill", "internal"), ("queue", "internal")]
    assert [o.name for o in store.operations("a", "server")] == ["POST /v1/chat/completions"]
    assert store.operations("a", "client") == [] and store.operations("nope") == []
    with pytest.raises(ValueError, match="bogus"):
        store.operations("a", "bogus")


def ids(traces) -> list[int]:
    return [int.from_bytes(t[0].span.trace_id[8:], "big") for t in traces]


def test_search_semantics(store):
    for n in range(10):  # one request per second; odd ones slow, every third aborted
        add(store, request(llm_spans(n, T0_NS + n * 10**9, e2e_s=2.0 if n % 2 else 0.2,
                                     error="abort" if n % 3 == 0 else None)))
    add(store, request(llm_spans(99, T0_NS), service="other", region="eu"))
    t0_us = T0_NS // 1000
    find = lambda **kw: ids(store.find_traces(TraceQuery("llm", **kw)))  # noqa: E731
    assert find() == list(range(9, -1, -1))  # newest first
    assert find(limit=3) == [9, 8, 7]
    assert find(start_us=t0_us + 2_000_000, end_us=t0_us + 4_000_000) == [4, 3, 2]
    assert find(operation="chat m", min_duration_us=1_000_000) == [9, 7, 5, 3, 1]
    assert find(operation="chat m", max_duration_us=1_000_000) == [8, 6, 4, 2, 0]
    assert find(operation="decode", min_duration_us=1_000_000, max_duration_us=1_000_000) == []
    assert find(tags={"error.type": "abort"}) == [9, 6, 3, 0]
    assert find(tags={"error": "true", "otel.status_description": "request finished with abort"}) == [9, 6, 3, 0]
    assert find(tags={"http.response.status_code": "200", "span.kind": "server"}, limit=2) == [9, 8]
    assert find(tags={"gen_ai.latency.e2e": "2"}) == [9, 7, 5, 3, 1]  # a double compared as a number
    assert find(tags={"gen_ai.usage.input_tokens": "12.0"}, limit=1) == [9]
    assert find(tags={"gen_ai.usage.input_tokens": "x"}) == []
    assert find(tags={"gen_ai.response.finish_reasons": '["abort"]'}) == [9, 6, 3, 0]
    assert find(tags={"service.instance.id": "x"}) == [] and find(operation="nope") == []
    assert find(tags={"otel.scope.name": "otel_llm", "gen_ai.operation.name": "chat"}, limit=1) == [9]
    assert ids(store.find_traces(TraceQuery("other", tags={"region": "eu"}))) == [99]
    assert store.find_traces(TraceQuery("unknown")) == []
    whole = store.find_traces(TraceQuery("llm", operation="queue", limit=1))[0]
    assert [s.span.name for s in whole] == ["POST /v1/chat/completions", "chat m", "queue", "prefill", "decode"]


def test_a_trace_spanning_services_is_returned_whole(store):
    spans = llm_spans(1, T0_NS)
    add(store, request(spans[:1], service="gateway"))
    add(store, request(spans[1:], service="engine"))
    (trace,) = store.find_traces(TraceQuery("gateway"))
    assert len(trace) == 5 and {s.resource.attributes[0].value.string_value for s in trace} == {"gateway", "engine"}


def test_slowest_and_failed_requests(store):
    for n, ttft in enumerate([0.1, 0.9, 0.5, 0.3, 0.7]):
        add(store, request(llm_spans(n, T0_NS + n * 10**9, ttft_s=ttft, queue_s=ttft / 10, e2e_s=2 - ttft,
                                     error={1: "abort", 3: "error"}.get(n))))
    t0_us = T0_NS // 1000
    slowest = store.slowest_requests("ttft", t0_us, limit=3)
    assert [r.ttft_s for r in slowest] == [0.9, 0.7, 0.5]
    r = slowest[0]
    assert (r.trace_id, r.span_id, r.service, r.operation, r.start_us, r.duration_us) == (
        tid(1), sid(1, 2), "llm", "chat m", t0_us + 1_000_000, 1_100_000)
    assert (r.e2e_s, r.queue_s, r.error, r.error_type, r.finish_reason) == (1.1, 0.09, True, "abort", "abort")
    assert [r.ttft_s for r in store.slowest_requests("ttft", t0_us + 2_500_000)] == [0.7, 0.3]
    assert [r.e2e_s for r in store.slowest_requests("e2e", 0, limit=2)] == [1.9, 1.7]
    assert store.slowest_requests("queue", 0, limit=1)[0].queue_s == 0.09
    with pytest.raises(ValueError, match="p99"):
        store.slowest_requests("p99", 0)
    failed = store.failed_requests(t0_us, t0_us + 10_000_000)
    assert [(int.from_bytes(r.trace_id[8:], "big"), r.error_type) for r in failed] == [(3, "error"), (1, "abort")]
    assert store.failed_requests(t0_us, t0_us + 2_000_000) == failed[1:]
    assert store.failed_requests(t0_us, t0_us + 10_000_000, limit=1) == failed[:1]


def test_vllm_llm_request_spans_are_requests(store):
    spans = [trace_pb2.Span(trace_id=bytes.fromhex(t), span_id=bytes.fromhex(s), name="llm_request", kind=SERVER,
                            start_time_unix_nano=start, end_time_unix_nano=end, attributes=kvs(attrs))
             for t, s, start, end, attrs in VLLM_SPANS]
    add(store, request(spans, service="unknown_service:python", scope="vllm.tracing.otel"))
    got = store.slowest_requests("ttft", 0, limit=10)
    assert [(r.trace_id.hex(), r.ttft_s, r.e2e_s, r.queue_s) for r in got] == [
        (t, a["gen_ai.latency.time_to_first_token"], a["gen_ai.latency.e2e"], a["gen_ai.latency.time_in_queue"])
        for t, _, _, _, a in VLLM_SPANS]  # the first one has the larger TTFT
    assert {r.operation for r in got} == {"llm_request"} and not any(r.error for r in got)
    assert all(r.finish_reason is None and r.error_type is None for r in got)


def test_retention_by_age(store):
    for n in range(6):
        add(store, request(llm_spans(n, T0_NS + n * 3600 * 10**9, error="abort")))
    add(store, request(llm_spans(50, T0_NS), service="old-only"))
    now_us = T0_NS // 1000 + 5 * 3600 * 10**6 + 1  # retention 24 h: nothing is that old
    assert store.enforce_retention(now_us) == 0
    hour_us = 3600 * 10**6
    assert store.enforce_retention(T0_NS // 1000 + 24 * hour_us + 5 * hour_us // 2) == 3 * 5 + 5  # hours 0-2, old-only
    assert ids(store.find_traces(TraceQuery("llm"))) == [5, 4, 3]
    assert store.services() == ["llm"]
    assert len(store.failed_requests(0, 1 << 62)) == 3 and len(store.slowest_requests("ttft", 0)) == 3
    assert store.enforce_retention(now_us + 100 * 3600 * 10**6) == 15
    assert store.services() == [] and store.failed_requests(0, 1 << 62) == []


def test_retention_by_size_deletes_the_oldest(tmp_path):
    store = TraceStore(TraceStoreConfig(str(tmp_path), max_bytes=1 << 20))
    try:
        n = 0
        while store.used_bytes() < 3 << 20:
            add(store, request([s for i in range(20) for s in llm_spans(n + i, T0_NS + (n + i) * 10**6)]))
            n += 20
        deleted = store.enforce_retention(T0_NS // 1000)
        assert 0 < deleted < 5 * n and store.used_bytes() <= 1 << 20
        assert store.trace(tid(0).hex()) == [] and len(store.trace(tid(n - 1).hex())) == 5
        # the oldest spans go in stored order: a request's row goes with its trace's 2nd span (the chat span)
        assert len(store.slowest_requests("ttft", 0, limit=n)) == n - (deleted + 3) // 5
        assert store.enforce_retention(T0_NS // 1000) == 0  # under the bound now: a no-op
    finally:
        store.close()


def test_reopening_keeps_everything(tmp_path):
    config = TraceStoreConfig(str(tmp_path))
    store = TraceStore(config)
    add(store, request(llm_spans(1, T0_NS)))
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.services()
    store = TraceStore(config)
    add(store, request(llm_spans(2, T0_NS + 10**9)))
    assert ids(store.find_traces(TraceQuery("llm"))) == [2, 1] and len(store.operations("llm")) == 5
    store.close()


def test_concurrent_writer_and_readers(store):
    errors, done = [], threading.Event()

    def writer():
        try:
            for batch in range(40):
                add(store, request([s for n in range(batch * 5, batch * 5 + 5) for s in llm_spans(n, T0_NS + n * 10**6)]))
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)
        finally:
            done.set()

    def reader():
        try:
            while not done.is_set():
                for trace in store.find_traces(TraceQuery("llm", limit=5)):
                    assert len(trace) == 5  # a batch is visible whole or not at all
                store.slowest_requests("ttft", 0)
                store.services()
                store.trace(tid(3).hex())
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.slowest_requests("ttft", 0, limit=1000)) == 200


def test_a_span_stored_again_is_kept_once_as_first_stored(store):
    spans = llm_spans(1, T0_NS)
    assert add(store, request(spans)) == 5
    later = llm_spans(1, T0_NS)
    later[1].name = "a later delivery"
    assert add(store, request(later + llm_spans(2, T0_NS))) == 5  # only trace 2's spans are new
    assert add(store, request(llm_spans(3, T0_NS) * 2)) == 5  # twice in one batch
    got = store.trace(tid(1).hex())
    assert [s.span for s in got] == sorted(spans, key=lambda s: s.start_time_unix_nano)
    assert sorted(r.trace_id for r in store.slowest_requests("ttft", 0)) == [tid(1), tid(2), tid(3)]
    assert [len(t) for t in store.find_traces(TraceQuery("llm"))] == [5, 5, 5]


def test_a_database_with_duplicate_spans_from_before_is_upgraded_at_open(tmp_path):
    """Before the unique (trace_id, span_id) index a span delivered twice had two rows (and its
    request two): opening such a database keeps the first, then creates the index."""
    config = TraceStoreConfig(str(tmp_path))
    store = TraceStore(config)
    add(store, request(llm_spans(1, T0_NS) + llm_spans(2, T0_NS)))
    store.close()
    db = sqlite3.connect(store.path)
    with db:  # what the previous version's schema and a resend left behind
        db.execute("DROP INDEX spans_span")
        db.execute("CREATE INDEX spans_trace ON spans (trace_id)")
        db.execute("INSERT INTO spans SELECT id + 100, trace_id, span_id, parent_span_id, service_id, resource_id, "
                   "scope_id, 'resent ' || name, kind, start_us, duration_us, status_code, body FROM spans")
        db.execute("INSERT INTO requests SELECT id + 100, trace_id, span_id, service_id, operation, start_us, "
                   "duration_us, ttft_s, e2e_s, queue_s, error, error_type, finish_reason, itl_s, preempted, model, instance, "
                   "lora, prompt_tokens FROM requests")
    assert db.execute("SELECT count(*) FROM spans").fetchone() == (20,)
    db.close()

    store = TraceStore(config)
    try:
        for n in (1, 2):
            assert [s.span.name for s in store.trace(tid(n).hex())] == [
                "POST /v1/chat/completions", "chat m", "queue", "prefill", "decode"]
        assert len(store.slowest_requests("ttft", 0)) == 2
        assert add(store, request(llm_spans(1, T0_NS))) == 0  # the index holds from now on
        with closing(sqlite3.connect(store.path)) as db:
            indexes = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                                      "AND tbl_name = 'spans'")}
        assert "spans_span" in indexes and "spans_trace" not in indexes
    finally:
        store.close()
