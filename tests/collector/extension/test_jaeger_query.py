"""Jaeger's v1 HTTP query API over the trace store: the trace JSON field by field (ids,
references, tags and their types and order, logs, processes), the envelope, search parameters
and their errors, spans from the real OTel SDK, and the LLM endpoints."""

from __future__ import annotations

import base64
import http.client
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from otel_llm.collector.extension.jaeger_query import JaegerQueryApi
from otel_llm.collector.timeline.rows import load, rows_from_traces
from tests.collector.tracestore.test_store import T0_NS, add, kvs, llm_spans, request, sid, tid

ENVELOPE = ["data", "total", "limit", "offset", "errors"]


def get(api: JaegerQueryApi, path: str, **params) -> tuple[int, dict]:
    query = urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(f"{api.url}{path}{'?' + query if query else ''}", timeout=10) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    doc = json.loads(body)
    assert list(doc) == ENVELOPE
    return status, doc


def ok(api, path: str, **params):
    status, doc = get(api, path, **params)
    assert status == 200 and doc["errors"] is None, doc
    return doc["data"]


def error(api, path: str, status: int, **params) -> str:
    got, doc = get(api, path, **params)
    assert got == status and doc["data"] is None and len(doc["errors"]) == 1, doc
    assert doc["errors"][0]["code"] == status
    return doc["errors"][0]["msg"]


def detailed_span() -> trace_pb2.Span:
    return trace_pb2.Span(
        trace_id=(0x1F).to_bytes(16, "big"), span_id=bytes.fromhex("00000000000000a1"),
        parent_span_id=bytes.fromhex("00000000000000a0"), name="chat m", kind=trace_pb2.Span.SPAN_KIND_CLIENT,
        start_time_unix_nano=T0_NS + 1_999, end_time_unix_nano=T0_NS + 1_501_998, trace_state="k=v",
        attributes=kvs({"s": "x", "b": True, "i": 7, "big": 2**60, "neg": -(2**53), "d": 0.25, "raw": b"\x00\xff",
                        "arr": ["stop", 1, 2.5, True], "map": {"a": 1, "b": [1.0]}}),
        events=[{"name": "first_token", "time_unix_nano": T0_NS + 500_999, "attributes": kvs({"n": 1})},
                {"name": "ignored", "time_unix_nano": T0_NS + 600_000, "attributes": kvs({"event": "renamed"})},
                {"name": "preempted", "time_unix_nano": T0_NS + 400_000}],
        links=[{"trace_id": tid(5), "span_id": sid(5, 1)},
               {"trace_id": tid(6), "span_id": sid(6, 1), "attributes": kvs({"opentracing.ref_type": "child_of"})}],
        status={"code": trace_pb2.Status.STATUS_CODE_ERROR, "message": "boom"})


def test_trace_json_field_by_field(api, store):
    add(store, request([detailed_span()], service="svc", **{"host.name": "h1", "service.instance.id": "i-1"}))
    (trace,) = ok(api, "/api/traces/1f", raw="true")  # raw: attributes and events as received
    assert list(trace) == ["traceID", "spans", "processes", "warnings"]
    assert trace["traceID"] == "000000000000001f" and trace["warnings"] is None
    assert trace["processes"] == {"p1": {"serviceName": "svc", "tags": [
        {"key": "host.name", "type": "string", "value": "h1"},
        {"key": "service.instance.id", "type": "string", "value": "i-1"}]}}
    (span,) = trace["spans"]
    assert list(span) == ["traceID", "spanID", "operationName", "references", "startTime", "duration", "tags", "logs",
                          "processID", "warnings"]  # flags (0) and parentSpanID omitted, as Jaeger does
    assert (span["traceID"], span["spanID"], span["operationName"]) == ("000000000000001f", "00000000000000a1", "chat m")
    assert span["references"] == [
        {"refType": "CHILD_OF", "traceID": "000000000000001f", "spanID": "00000000000000a0"},
        {"refType": "FOLLOWS_FROM", "traceID": tid(5).hex(), "spanID": sid(5, 1).hex()},
        {"refType": "CHILD_OF", "traceID": tid(6).hex(), "spanID": sid(6, 1).hex()}]
    assert (span["startTime"], span["duration"]) == (T0_NS // 1000 + 1, 1499)  # µs, truncated like Go
    assert span["processID"] == "p1" and span["warnings"] is None
    assert span["tags"] == [
        {"key": "otel.scope.name", "type": "string", "value": "otel_llm"},
        {"key": "otel.scope.version", "type": "string", "value": "0.1.0"},
        {"key": "s", "type": "string", "value": "x"},
        {"key": "b", "type": "bool", "value": True},
        {"key": "i", "type": "int64", "value": 7},
        {"key": "big", "type": "int64", "value": str(2**60)},
        {"key": "neg", "type": "int64", "value": str(-(2**53))},
        {"key": "d", "type": "float64", "value": 0.25},
        {"key": "raw", "type": "binary", "value": base64.b64encode(b"\x00\xff").decode()},
        {"key": "arr", "type": "string", "value": '["stop",1,2.5,true]'},
        {"key": "map", "type": "string", "value": '{"a":1,"b":[1]}'},
        {"key": "span.kind", "type": "string", "value": "client"},
        {"key": "otel.status_code", "type": "string", "value": "ERROR"},
        {"key": "error", "type": "bool", "value": True},
        {"key": "otel.status_description", "type": "string", "value": "boom"},
        {"key": "w3c.tracestate", "type": "string", "value": "k=v"}]
    assert span["logs"] == [
        {"timestamp": T0_NS // 1000 + 500, "fields": [{"key": "event", "type": "string", "value": "first_token"},
                                                      {"key": "n", "type": "int64", "value": 1}]},
        {"timestamp": T0_NS // 1000 + 600, "fields": [{"key": "event", "type": "string", "value": "renamed"}]},
        {"timestamp": T0_NS // 1000 + 400, "fields": [{"key": "event", "type": "string", "value": "preempted"}]}]
    # by default, as Jaeger's query service: attributes sorted by key, logs by time, the rest unchanged
    (adjusted,) = ok(api, "/api/traces/1f")
    (sorted_span,) = adjusted["spans"]
    assert [t["key"] for t in sorted_span["tags"]] == [
        "otel.scope.name", "otel.scope.version", "arr", "b", "big", "d", "i", "map", "neg", "raw", "s", "span.kind",
        "otel.status_code", "error", "otel.status_description", "w3c.tracestate"]
    assert sorted(sorted_span["tags"], key=str) == sorted(span["tags"], key=str)
    assert sorted_span["logs"] == [span["logs"][2], span["logs"][0], span["logs"][1]]
    assert adjusted["processes"] == trace["processes"]


def test_processes_are_numbered_by_first_appearance(api, store):
    spans = llm_spans(1, T0_NS)
    add(store, request(spans[:2], service="gateway"))
    add(store, request(spans[2:], service="engine", **{"host.name": "gpu-1"}))
    req = request([trace_pb2.Span(trace_id=tid(1), span_id=sid(1, 9), name="bare", start_time_unix_nano=T0_NS + 9)])
    req.resource_spans[0].ClearField("resource")
    add(store, req)
    (trace,) = ok(api, f"/api/traces/{tid(1).hex()}")
    assert trace["traceID"] == tid(1).hex() and len(trace["traceID"]) == 32
    assert [(s["operationName"], s["processID"]) for s in trace["spans"]] == [
        ("POST /v1/chat/completions", "p1"), ("chat m", "p1"), ("queue", "p2"), ("bare", "p3"), ("prefill", "p2"),
        ("decode", "p2")]
    assert trace["processes"] == {"p1": {"serviceName": "gateway", "tags": []},
                                  "p2": {"serviceName": "engine",
                                         "tags": [{"key": "host.name", "type": "string", "value": "gpu-1"}]},
                                  "p3": {"serviceName": "OTLPResourceNoServiceName", "tags": []}}
    bare = trace["spans"][3]
    assert bare["references"] == [] and bare["logs"] == [] and [t["key"] for t in bare["tags"]] == [
        "otel.scope.name", "otel.scope.version"]  # no kind (UNSPECIFIED), no status (UNSET)


def test_services_and_operations_endpoints(api, store):
    add(store, request(llm_spans(1, T0_NS), service="a/b c"))
    add(store, request(llm_spans(2, T0_NS), service="z"))
    status, doc = get(api, "/api/services")
    assert status == 200 and doc == {"data": ["a/b c", "z"], "total": 2, "limit": 0, "offset": 0, "errors": None}
    assert ok(api, "/api/services/a%2Fb%20c/operations") == [
        "POST /v1/chat/completions", "chat m", "decode", "prefill", "queue"]
    assert ok(api, "/api/operations", service="z", spanKind="server") == [
        {"name": "POST /v1/chat/completions", "spanKind": "server"}]
    assert len(ok(api, "/api/operations", service="z")) == 5 and ok(api, "/api/operations", service="nope") == []
    assert error(api, "/api/operations", 400) == "parameter 'service' is required"
    assert "bogus" in error(api, "/api/operations", 400, service="z", spanKind="bogus")


def test_search(api, store):
    for n in range(6):
        add(store, request(llm_spans(n, T0_NS + n * 10**9, e2e_s=2.0 if n % 2 else 0.2,
                                     error="abort" if n % 3 == 0 else None)))
    t0_us, end = T0_NS // 1000, T0_NS // 1000 + 100_000_000
    search = lambda **kw: [int(t["traceID"][-2:], 16) for t in ok(api, "/api/traces", service="llm",  # noqa: E731
                                                                   start=t0_us, end=end, **kw)]
    assert search() == [5, 4, 3, 2, 1, 0]
    assert search(limit=2) == [5, 4]
    assert search(operation="chat m", minDuration="1s") == [5, 3, 1]
    assert search(operation="chat m", maxDuration="500ms", minDuration="100ms") == [4, 2, 0]
    assert search(tags='{"error.type":"abort"}') == [3, 0]
    assert search(tag=["error:true", "otel.status_description:request finished with abort"]) == [3, 0]
    assert search(tags='{"error":"true"}', tag="gen_ai.usage.input_tokens:12") == [3, 0]
    assert search(tags='{"error":"true"}', tag="http.response.status_code:200") == []  # one span must match all
    assert ok(api, "/api/traces", service="llm", start=t0_us + 1_500_000, end=t0_us + 3_200_000, operation="chat m") \
        and search(operation="nope") == []
    assert ok(api, "/api/traces", service="llm") == []  # default window: the last 48 h, and T0 is in 2026-09
    traces = ok(api, "/api/traces", service="llm", start=t0_us, end=end, operation="decode", limit=1)
    assert len(traces) == 1 and len(traces[0]["spans"]) == 5


def test_search_by_trace_ids(api, store):
    add(store, request(llm_spans(1, T0_NS)))
    status, doc = get(api, "/api/traces", traceID=[tid(1).hex(), "abc"])
    assert status == 200 and [t["traceID"] for t in doc["data"]] == [tid(1).hex()]
    assert doc["errors"] == [{"msg": "trace not found", "traceID": "0000000000000abc"}]


@pytest.mark.parametrize("params, message", [
    ({}, "parameter 'service' is required"),
    ({"service": "s", "minDuration": "10"}, 'invalid duration "10"'),
    ({"service": "s", "maxDuration": "1x"}, "'maxDuration'"),
    ({"service": "s", "minDuration": "2s", "maxDuration": "1s"}, "'maxDuration' should be greater than 'minDuration'"),
    ({"service": "s", "tags": "{not json"}, "cannot unmarshal JSON"),
    ({"service": "s", "tags": '{"a": 1}'}, "malformed 'tags'"),
    ({"service": "s", "tag": "novalue"}, "expecting key:value"),
    ({"service": "s", "limit": "0"}, "limit must be greater than 0"),
    ({"service": "s", "limit": "x"}, "'limit'"),
    ({"service": "s", "limit": str(2**31)}, "'limit'"),
    ({"service": "s", "end": str(2**63)}, "'end'"),
    ({"service": "s", "start": "1_000"}, "'start'"),
    ({"service": "s", "minDuration": "9999999999h"}, "'minDuration'"),
    ({"service": "s", "minDuration": "-1s"}, "must not be negative"),
    ({"service": "s", "start": "soon"}, "'start'"),
    ({"service": "s", "start": "5", "end": "4"}, "start time must be before end time"),
    ({"traceID": "not-hex"}, "not-hex"),
    ({"service": "s", "raw": "maybe"}, "'raw'"),
])
def test_bad_search_parameters_answer_400(api, params, message):
    assert message in error(api, "/api/traces", 400, **params)


def test_trace_lookup_errors_and_unknown_paths(api, store):
    add(store, request(llm_spans(1, T0_NS)))
    assert error(api, f"/api/traces/{tid(2).hex()}", 404) == "trace not found"
    assert "1234567890abcdef1234567890abcdef0" in error(api, "/api/traces/1234567890abcdef1234567890abcdef0", 400)
    assert "zz" in error(api, "/api/traces/zz", 400)
    assert "'start'" in error(api, f"/api/traces/{tid(1).hex()}", 400, start="x")
    assert len(ok(api, f"/api/traces/{tid(1).hex()}", start=1, end=2)[0]["spans"]) == 5  # hints, ignored
    assert "unknown path" in error(api, "/api/nothing", 404)
    assert "unknown path" in error(api, "/", 404)


def test_spans_from_the_real_sdk(api, store):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-svc", "deployment.environment": "t"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("my.lib", "2.0")
    with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER) as parent:
        with tracer.start_as_current_span("chat m", links=[Link(parent.get_span_context())],
                                          attributes={"gen_ai.latency.time_to_first_token": 0.25,
                                                      "gen_ai.response.finish_reasons": ("length",)}) as child:
            child.add_event("first_token", {"tokens": 1})
            child.set_status(Status(StatusCode.ERROR, "cancelled"))
    spans = exporter.get_finished_spans()
    assert store.add(encode_spans(spans).SerializeToString()) == 2
    trace_id = format(parent.get_span_context().trace_id, "032x")
    (trace,) = ok(api, f"/api/traces/{trace_id}")
    by_name = {s["operationName"]: s for s in trace["spans"]}
    server, chat = by_name["POST /v1/chat/completions"], by_name["chat m"]
    assert chat["references"] == [{"refType": "FOLLOWS_FROM", "traceID": trace_id,  # the link to the parent sets the type
                                   "spanID": format(parent.get_span_context().span_id, "016x")}]
    assert server["references"] == [] and chat["spanID"] == format(child.get_span_context().span_id, "016x")
    sdk_chat = spans[0]  # ended first
    assert (chat["startTime"], chat["duration"]) == (sdk_chat.start_time // 1000,
                                                     (sdk_chat.end_time - sdk_chat.start_time) // 1000)
    assert [t["key"] for t in chat["tags"]] == ["otel.scope.name", "otel.scope.version", "gen_ai.latency.time_to_first_token",
                                                "gen_ai.response.finish_reasons", "span.kind", "otel.status_code", "error",
                                                "otel.status_description"]
    assert chat["tags"][3] == {"key": "gen_ai.response.finish_reasons", "type": "string", "value": '["length"]'}
    assert chat["logs"][0]["fields"] == [{"key": "event", "type": "string", "value": "first_token"},
                                         {"key": "tokens", "type": "int64", "value": 1}]
    process = trace["processes"][server["processID"]]
    assert process["serviceName"] == "sdk-svc" and "telemetry.sdk.language" in [t["key"] for t in process["tags"]]
    assert "service.name" not in [t["key"] for t in process["tags"]]
    (summary,) = ok(api, "/api/llm/failed")
    assert (summary["traceID"], summary["finishReason"], summary["ttftSeconds"]) == (trace_id, "length", 0.25)


def test_llm_endpoints(api, store):
    now = time.time_ns()
    for n, ttft in enumerate([0.1, 0.9, 0.5, 0.3]):  # requests of the last minute, plus an old slow one
        add(store, request(llm_spans(n, now - (60 - n) * 10**9, ttft_s=ttft, error="abort" if n == 2 else None)))
    add(store, request(llm_spans(9, now - 3600 * 10**9, ttft_s=5.0, error="error")))
    slowest = ok(api, "/api/llm/slowest", limit=2)
    assert [r["ttftSeconds"] for r in slowest] == [0.9, 0.5]
    assert list(slowest[0]) == ["traceID", "spanID", "service", "operation", "startTime", "duration", "ttftSeconds",
                                "e2eSeconds", "queueSeconds", "error", "errorType", "finishReason"]
    assert slowest[0]["traceID"] == tid(1).hex() and slowest[0]["spanID"] == sid(1, 2).hex()
    assert slowest[0]["service"] == "llm" and slowest[0]["operation"] == "chat m" and slowest[0]["error"] is False
    assert [r["ttftSeconds"] for r in ok(api, "/api/llm/slowest", lookback="2h", limit=1)] == [5.0]
    assert len(ok(api, "/api/llm/slowest", metric="queue")) == 4 and ok(api, "/api/llm/slowest", metric="e2e")
    failed = ok(api, "/api/llm/failed")
    assert [(r["traceID"], r["errorType"], r["finishReason"]) for r in failed] == [
        (tid(2).hex(), "abort", "abort"), (tid(9).hex(), "error", "error")]
    assert len(ok(api, "/api/llm/failed", start=(now - 120 * 10**9) // 1000)) == 1
    assert "p99" in error(api, "/api/llm/slowest", 400, metric="p99")
    assert "lookback" in error(api, "/api/llm/slowest", 400, lookback="5")
    assert "limit" in error(api, "/api/llm/failed", 400, limit="-1")


def test_timeline_endpoint(api, store):
    now = time.time_ns()
    for n, (ttft, error) in enumerate([(0.1, None), (0.9, "abort"), (0.5, None)]):
        add(store, request(llm_spans(n, now - (60 - n) * 10**9 + 123, ttft_s=ttft, error=error, model=f"m{n % 2}"),
                           **{"service.instance.id": f"i-{n}"}))
    add(store, request(llm_spans(9, now - 3600 * 10**9)))  # before the default window, the last 15 minutes
    status, doc = get(api, "/api/llm/timeline")
    data = doc["data"]
    assert list(data) == ["start", "end", "truncated", "matched", "chosen", "requests", "models", "instances",
                          "finishReasons", "rows", "load", "lanes"]
    assert (data["matched"], data["chosen"]) == (3, "all")
    assert data["end"] - data["start"] == 15 * 60 * 10**6 and abs(data["end"] - now // 1000) < 60 * 10**6
    assert status == 200 and doc["total"] == data["requests"] == 3 and doc["errors"] is None
    assert data["truncated"] is False and ok(api, "/api/llm/timeline", limit=2)["truncated"] is True
    assert ok(api, "/api/llm/timeline", limit=3)["truncated"] is False
    expected = rows_from_traces(store.request_traces(data["start"], data["end"]))
    assert data["rows"] == [row.as_json() for row in expected] and data["load"] == [p.as_json() for p in load(expected)]
    first = data["rows"][0]  # ns to the last digit, as strings
    assert (first["trace_id"], first["start_ns"]) == (tid(0).hex(), str(now - 60 * 10**9 + 123))
    assert first["queue"] == [str(now - 60 * 10**9 + 123), str(now - 60 * 10**9 + 123 + 10**7)]
    assert (data["models"], data["instances"], data["finishReasons"]) == (["m0", "m1"], ["i-0", "i-1", "i-2"],
                                                                          ["abort", "stop"])

    def shown(**params) -> list[int]:
        return [int(r["trace_id"][-2:], 16) for r in ok(api, "/api/llm/timeline", **params)["rows"]]
    assert shown(model="m0") == [0, 2] and shown(instance="i-2") == [2] and shown(finishReason="abort") == [1]
    assert shown(ttftAbove="0.5") == [1] and shown(ttftAbove="0.05") == [0, 1, 2]  # exclusive
    assert shown(e2eAbove="0.4") == [0, 1, 2] and shown(e2eAbove="0.5", model="m0") == []
    assert shown(lookback="2h") == [9, 0, 1, 2]
    few = ok(api, "/api/llm/timeline", lookback="2h", limit=2)  # not the first two: the failed one, then ...
    assert few["matched"] == 4 and few["truncated"] and 1 in [int(r["trace_id"][-2:], 16) for r in few["rows"]]
    assert few["chosen"] == "the failed, the slowest by e2e and an even sample"
    # a region of the overview: TTFT in [0.4 s, 1 s) of the last 15 minutes
    assert shown(metric="ttft", min="0.4", max="1") == [1, 2] and ok(api, "/api/llm/timeline", metric="ttft",
                                                                      min="0.4")["matched"] == 2
    assert shown(start=(now - 61 * 10**9) // 1000, end=(now - 59 * 10**9) // 1000 + 1) == [0, 1]  # 1 starts 123 ns in
    aborted = ok(api, "/api/llm/timeline", finishReason="abort")
    (row,) = [r for r in expected if r.finish_reason == "abort"]
    assert aborted["requests"] == 3 and aborted["load"] == [p.as_json() for p in load([row])]  # the rows shown


@pytest.mark.parametrize("params, message", [
    ({"metric": "p99"}, "unknown metric 'p99'"),
    ({"min": "0.5"}, "a latency range needs a metric"),
    ({"metric": "ttft", "max": "-1"}, "high must be a finite number"),
    ({"ttftAbove": "slow"}, "'ttftAbove'"),
    ({"e2eAbove": "-1"}, "-1.0"),
    ({"ttftAbove": "nan"}, "nan"),
    ({"start": "5", "end": "4"}, "start time must be before end time"),
    ({"lookback": "-1s"}, "start time must be before end time"),
    ({"lookback": "15"}, "'lookback'"),
    ({"end": "now"}, "'end'"),
    ({"limit": "0"}, "limit must be greater than 0"),
])
def test_bad_timeline_parameters_answer_400(api, params, message):
    assert message in error(api, "/api/llm/timeline", 400, **params)


def test_the_web_view_is_served_from_the_package(api):
    files = {}
    for path, content_type in (("/ui", "text/html"), ("/ui/", "text/html"), ("/ui/index.html", "text/html"),
                               ("/ui/timeline.js", "text/javascript"), ("/ui/overview.js", "text/javascript"),
                               ("/ui/timeline.css", "text/css")):
        with urllib.request.urlopen(api.url + path, timeout=10) as answer:
            assert answer.status == 200 and answer.headers["Content-Type"].startswith(content_type)
            files[path] = answer.read().decode()
    assert files["/ui"] == files["/ui/"] == files["/ui/index.html"]
    assert re.findall(r'(?:src|href)="([^"]*)"', files["/ui"]) == ["/ui/timeline.css", "/ui/overview.js",
                                                                  "/ui/timeline.js"]
    assert re.findall(r"https?://[^\"'\s]+", files["/ui/timeline.js"] + files["/ui/overview.js"] +
                      files["/ui/timeline.css"]) == ["http://www.w3.org/2000/svg"]  # nothing is fetched from elsewhere
    connection = http.client.HTTPConnection(api.host, api.port, timeout=10)
    for path, status, location in (("/ui/trace/0123ABCdef", 302, "/ui#trace=0123abcdef"), ("/ui/trace/zz", 404, None),
                                   ("/ui/nothing.js", 404, None), ("/ui/../collector/app.py", 404, None)):
        connection.request("GET", path)
        answer = connection.getresponse()
        answer.read()
        assert (answer.status, answer.getheader("Location")) == (status, location), path
    connection.close()


def test_dependencies_as_jaeger_answers_them(api, store):
    from tests.collector.tracestore.test_dependencies import gateway_call

    for n in range(1, 3):
        client, tree = gateway_call(n, T0_NS)
        add(store, request([client], service="gateway"))
        add(store, request(tree))
    end_ms = T0_NS // 1_000_000 + 60_000
    status, doc = get(api, "/api/dependencies", endTs=end_ms, lookback=3600_000)  # ms, as the UI sends them
    assert (status, doc["data"], doc["total"], doc["errors"]) == (
        200, [{"parent": "gateway", "child": "llm", "callCount": 2}], 0, None)
    assert ok(api, "/api/dependencies", endTs=end_ms - 7200_000, lookback=60_000) == []
    assert ok(api, "/api/dependencies", endTs=end_ms, lookback=3600_000, service="nobody") == []
    assert error(api, "/api/dependencies", 400, endTs="soon").startswith("unable to parse param 'endTs'")


def test_service_performance_monitoring_as_the_monitor_tab_asks(api, store):
    """The Monitor tab's 8 requests per refresh (latencies at 0.5/0.75/0.95, calls, errors; then grouped by
    operation), answered as Jaeger's Prometheus reader does: a MetricFamily, ms, per second, a fraction."""
    base = T0_NS - T0_NS % 60_000_000_000
    for n in range(1, 41):  # 40 requests over two minutes, every 4th aborted
        add(store, request(llm_spans(n, base + n * 3 * 10**9, e2e_s=0.1 * (n % 7 + 1),
                                     error="abort" if n % 4 == 0 else None)))
    end_ms = base // 1_000_000 + 180_000
    ui = {"service": "llm", "endTs": end_ms, "lookback": 3600_000, "step": 60_000, "ratePer": 600_000,
          "spanKind": "internal"}  # the chat span (an INTERNAL span carries the status here)
    fams = {q: ok_json(api, "/api/metrics/latencies", quantile=q, **ui) for q in (0.5, 0.75, 0.95)}
    calls, errors = ok_json(api, "/api/metrics/calls", quantile=0.95, **ui), ok_json(api, "/api/metrics/errors", **ui)
    assert (fams[0.95]["name"], fams[0.95]["type"], fams[0.95]["help"]) == (
        "service_latencies", "GAUGE", "0.95th quantile latency, grouped by service")
    assert (calls["name"], calls["help"]) == ("service_call_rate", "calls/sec, grouped by service")
    assert errors["name"] == "service_error_rate" and errors["help"].startswith("error rate, computed as a fraction")
    [series] = calls["metrics"]
    assert series["labels"] == [{"name": "service_name", "value": "llm"}]  # the UI reads labels[0] as the service
    points = series["metricPoints"]
    assert len(points) == 61 and points[-1]["timestamp"].endswith("Z") and "T" in points[-1]["timestamp"]
    # the chat span and its three phases are INTERNAL: 160 spans, 40 of them errors, in the last 10 minutes
    assert round(points[-1]["gaugeValue"]["doubleValue"] * 600) == 160
    assert errors["metrics"][0]["metricPoints"][-1]["gaugeValue"]["doubleValue"] == pytest.approx(10 / 160)
    p50, p95 = (fams[q]["metrics"][0]["metricPoints"][-1]["gaugeValue"]["doubleValue"] for q in (0.5, 0.95))
    assert 0 < p50 < p95 < 1000  # milliseconds
    grouped = ok_json(api, "/api/metrics/calls", groupByOperation="true", **ui)
    assert grouped["name"] == "service_operation_call_rate" and grouped["help"].endswith("& operation")
    ops = {next(lab["value"] for lab in m["labels"] if lab["name"] == "operation"): m for m in grouped["metrics"]}
    assert sorted(ops) == ["chat m", "decode", "prefill", "queue"]
    assert ok_json(api, "/api/metrics/calls", service="nobody", endTs=end_ms)["metrics"] == []  # always the key
    assert error(api, "/api/metrics/calls", 400) == "unable to parse param 'service': please provide at least one " \
        "service name"
    assert error(api, "/api/metrics/latencies", 400, service="llm").startswith("unable to parse param 'quantile'")
    assert error(api, "/api/metrics/calls", 400, service="llm", spanKind="sideways") == \
        "unable to parse param 'spanKind': unsupported span kind: 'sideways'"
    assert get(api, "/api/metrics/minstep")[0] == 404  # gone from Jaeger too


def ok_json(api, path: str, **params) -> dict:
    with urllib.request.urlopen(f"{api.url}{path}?{urllib.parse.urlencode(params, doseq=True)}", timeout=10) as r:
        assert r.status == 200
        return json.loads(r.read())


def test_the_uis_upload_turns_otlp_json_into_the_trace_it_shows(api, store):
    """`POST /api/transform` (the UI's Upload): the OTLP/JSON of a stored trace comes back as the trace view
    shows it from the store; archive (no archive storage here) and unknown paths answer in the envelope."""
    add(store, request(llm_spans(1, T0_NS), service="svc"))
    otlp = ok_json(api, f"/api/v3/traces/{tid(1).hex()}")["result"]  # OTLP/JSON, as a user would save it
    status, doc = post(api, "/api/transform", json.dumps(otlp).encode())
    assert status == 200 and doc["errors"] is None and doc["total"] == 1
    assert doc["data"] == ok(api, f"/api/traces/{tid(1).hex()}")
    assert post(api, "/api/transform", b"{not json")[0] == 400
    status, doc = post(api, f"/api/archive/{tid(1).hex()}", b"")
    assert status == 501 and "archive storage is not configured" in doc["errors"][0]["msg"]
    assert post(api, "/api/nothing", b"")[0] == 404


def post(api, path: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(f"{api.url}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_deep_dependency_graph_lists_the_paths_through_a_service(api, store):
    """An app calls a gateway, which calls the llm server (and, in one trace, a second server): the
    Deep Dependency Graph's paths through the gateway are the traces' chains of service entries."""
    from tests.collector.tracestore.test_dependencies import gateway_call

    def app_span(n):
        return trace_pb2.Span(trace_id=tid(n), span_id=sid(n, 7), name="ask", kind=trace_pb2.Span.SPAN_KIND_CLIENT,
                              start_time_unix_nano=T0_NS + n * 10**9 - 50_000, end_time_unix_nano=T0_NS + n * 10**9 + 2)
    for n in range(1, 4):
        client, tree = gateway_call(n, T0_NS + n * 10**9)
        entry = trace_pb2.Span(trace_id=tid(n), span_id=sid(n, 8), parent_span_id=sid(n, 7), name="POST /chat",
                               kind=trace_pb2.Span.SPAN_KIND_SERVER, start_time_unix_nano=T0_NS + n * 10**9 - 20_000,
                               end_time_unix_nano=T0_NS + n * 10**9 + 1)
        client.parent_span_id = sid(n, 8)  # the gateway's client span inside its server span
        add(store, request([app_span(n)], service="app"))
        add(store, request([entry, client], service="gateway"))
        add(store, request(tree))
    window = {"start": T0_NS // 1_000_000 - 60_000, "end": T0_NS // 1_000_000 + 60_000}
    doc = ok_json(api, "/analytics/v1/dependencies", service="gateway", **window)
    assert doc == {"dependencies": [{
        "path": [{"service": "app", "operation": "ask"}, {"service": "gateway", "operation": "POST /chat"},
                 {"service": "llm", "operation": "POST /v1/chat/completions"}],
        "attributes": [{"key": "exemplar_trace_id", "value": tid(3).hex()}]}]}  # three traces, one path
    assert ok_json(api, "/analytics/v1/dependencies", service="gateway", operation="GET /other",
                   **window) == {"dependencies": []}
    assert error(api, "/analytics/v1/dependencies", 400) == "parameter 'service' is required"
