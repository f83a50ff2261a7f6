"""Jaeger's query API v3 over the trace store, as Jaeger v2.19+ answers and its current UI calls it:
services, operations, trace summaries (the UI's search, with the parameters its client sends),
OTLP/JSON traces, Jaeger's error bodies and wording, and the Go value parsers behind them."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_llm.collector.extension.go_values import duration_ns, parse_bool, rfc3339_ns
from tests.collector.tracestore.test_store import ERROR, T0_NS, add, llm_spans, request, sid, tid


def get(api, path: str, **params) -> tuple[int, str, bytes]:
    query = urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(f"{api.url}{path}{'?' + query if query else ''}", timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def ok(api, path: str, **params) -> dict:
    status, ctype, body = get(api, path, **params)
    assert (status, ctype) == (200, "application/json"), body
    return json.loads(body)


def error(api, path: str, status: int, **params) -> str:
    got, ctype, body = get(api, path, **params)
    assert (got, ctype) == (status, "text/plain; charset=utf-8"), body
    doc = json.loads(body)
    assert list(doc) == ["error"] and list(doc["error"]) == ["httpCode", "message"] and doc["error"]["httpCode"] == status
    return doc["error"]["message"]


def iso(ns: int) -> str:
    """What the UI sends: `new Date(ms).toISOString()` (milliseconds, UTC, Z)."""
    return datetime.fromtimestamp(ns // 1_000_000 / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def window(**extra) -> dict:
    return {"query.startTimeMin": iso(T0_NS - 3_600 * 10**9), "query.startTimeMax": iso(T0_NS + 3_600 * 10**9),
            **extra}


@pytest.fixture
def traces(store):
    """Three requests of `llm` (one aborted), one gateway trace across two services with an orphan span."""
    add(store, request(llm_spans(1, T0_NS, e2e_s=0.5)))
    add(store, request(llm_spans(2, T0_NS + 10**9, e2e_s=2.0, error="abort")))
    add(store, request(llm_spans(3, T0_NS + 2 * 10**9, e2e_s=1.0, model="other")))
    gateway = trace_pb2.Span(trace_id=tid(4), span_id=sid(4, 9), name="GET /chat", kind=trace_pb2.Span.SPAN_KIND_CLIENT,
                             start_time_unix_nano=T0_NS + 3 * 10**9 - 5_000, end_time_unix_nano=T0_NS + 4 * 10**9)
    add(store, request([gateway], service="gateway", **{"deployment.environment": "prod"}))
    tree = llm_spans(4, T0_NS + 3 * 10**9, e2e_s=0.9)
    tree[0].parent_span_id = sid(4, 9)
    lost = trace_pb2.Span(trace_id=tid(4), span_id=sid(4, 8), parent_span_id=sid(99, 1), name="lost",
                          start_time_unix_nano=T0_NS + 3 * 10**9, end_time_unix_nano=T0_NS + 3 * 10**9 + 10,
                          status={"code": ERROR})
    add(store, request([*tree, lost]))


def test_services_and_operations_as_the_ui_reads_them(api, store, traces):
    assert ok(api, "/api/v3/services") == {"services": ["gateway", "llm"]}
    ops = ok(api, "/api/v3/operations", service="llm")["operations"]
    assert {"name": "POST /v1/chat/completions", "spanKind": "server"} in ops
    assert {"name": "queue", "spanKind": "internal"} in ops
    assert {"name": "lost", "spanKind": "internal"} in ops  # an unspecified kind reads "internal", never missing
    assert all(list(op) == ["name", "spanKind"] for op in ops)
    assert ok(api, "/api/v3/operations", service="llm", spanKind="server")["operations"] == [
        {"name": "POST /v1/chat/completions", "spanKind": "server"}]
    assert ok(api, "/api/v3/operations", service="llm", span_kind="SERVER")["operations"] == [
        {"name": "POST /v1/chat/completions", "spanKind": "server"}]  # the deprecated alias, any case
    assert ok(api, "/api/v3/operations", service="nobody") == {"operations": []}
    assert ok(api, "/api/v3/operations", service="llm", spanKind="sideways") == {"operations": []}


def test_an_empty_store_answers_with_the_keys_the_ui_requires(api):
    assert ok(api, "/api/v3/services") == {"services": []}
    assert ok(api, "/api/v3/trace-summaries", **window(**{"query.serviceName": "llm"})) == {"summaries": []}


def test_trace_summaries_field_by_field(api, traces):
    found = ok(api, "/api/v3/trace-summaries", **window(**{"query.serviceName": "gateway", "query.searchDepth": "20"}))
    [s] = found["summaries"]
    assert s == {
        "traceId": tid(4).hex(), "minStartTimeUnixNano": str(T0_NS + 3 * 10**9 - 5_000),
        "maxEndTimeUnixNano": str(T0_NS + 4 * 10**9), "spanCount": 7, "errorSpanCount": 1, "orphanSpanCount": 1,
        "rootServiceName": "gateway", "rootOperationName": "GET /chat",
        "services": [{"name": "gateway", "spanCount": 1}, {"name": "llm", "spanCount": 6, "errorSpanCount": 1}]}
    plain = ok(api, "/api/v3/trace-summaries", **window(**{"query.serviceName": "llm", "query.operationName": "chat m"}))
    assert [x["traceId"] for x in plain["summaries"]] == [tid(4).hex(), tid(2).hex(), tid(1).hex()]  # newest first
    one = next(x for x in plain["summaries"] if x["traceId"] == tid(1).hex())
    assert "errorSpanCount" not in one and "orphanSpanCount" not in one  # 0 is left out, as jsonpb does
    assert one["spanCount"] == 5 and one["rootOperationName"] == "POST /v1/chat/completions"


@pytest.mark.parametrize("params, want", [
    ({"query.serviceName": "llm", "query.durationMin": "1500ms"}, [2]),  # the UI's Go durations
    ({"query.serviceName": "llm", "query.durationMin": "800ms", "query.durationMax": "1.2s"}, [4, 3]),
    ({"query.serviceName": "llm", "query.attributes": json.dumps({"error.type": "abort"})}, [2]),
    ({"query.serviceName": "llm", "query.attributes": json.dumps({"error": "true"})}, [4, 2]),
    ({"query.serviceName": "llm", "query.attributes": json.dumps({"span.status": "Error", "gen_ai.request.model": "m"})},
     [2]),
    ({"query.serviceName": "llm", "query.attributes": json.dumps({"scope.name": "otel_llm", "span.kind": "server"})},
     [4, 3, 2, 1]),
    ({"query.serviceName": "gateway", "query.attributes": json.dumps({"resource.deployment.environment": "prod"})}, [4]),
    ({"query.serviceName": "llm", "query.operationName": "queue", "query.searchDepth": "2"}, [4, 3]),
    ({"query.service_name": "llm", "query.operation_name": "chat other"}, [3]),  # the snake_case aliases
    ({"query.serviceName": "llm", "query.num_traces": "1"}, [4]),
])
def test_search_parameters_as_the_ui_sends_them(api, traces, params, want):
    found = ok(api, "/api/v3/trace-summaries", **window(**params))["summaries"]
    assert [x["traceId"] for x in found] == [tid(n).hex() for n in want]


def test_the_time_window_bounds_the_search(api, traces):
    def search(start_ns, end_ns):
        return [x["traceId"] for x in ok(api, "/api/v3/trace-summaries", **{
            "query.serviceName": "llm", "query.startTimeMin": iso(start_ns), "query.startTimeMax": iso(end_ns)})
            ["summaries"]]
    assert search(T0_NS + 500_000_000, T0_NS + 2_500_000_000) == [tid(3).hex(), tid(2).hex()]
    offset = {"query.serviceName": "llm", "query.startTimeMin": "2026-09-21T16:13:20.5+02:00",
              "query.startTimeMax": "2026-09-21T16:13:22.5+02:00"}  # RFC 3339 with an offset: the same window
    assert datetime(2026, 9, 21, 14, 13, 20, tzinfo=timezone.utc).timestamp() * 10**9 == T0_NS
    assert [x["traceId"] for x in ok(api, "/api/v3/trace-summaries", **offset)["summaries"]] == \
        [tid(3).hex(), tid(2).hex()]


@pytest.mark.parametrize("params, status, message", [
    ({"query.serviceName": "llm"}, 400, "query.startTimeMin and query.startTimeMax are required"),
    (window(**{"query.serviceName": "llm", "query.startTimeMax": iso(T0_NS - 3_600 * 10**9)}), 400,
     "query.startTimeMin must be before query.startTimeMax"),
    (window(**{"query.serviceName": "llm", "query.startTimeMin": "yesterday"}), 400,
     'malformed parameter query.startTimeMin: parsing time "yesterday" as "2006-01-02T15:04:05.999999999Z07:00"'),
    (window(**{"query.serviceName": "llm", "query.durationMin": "1 s"}), 400,
     'malformed parameter query.durationMin: time: invalid duration "1 s"'),
    (window(**{"query.serviceName": "llm", "query.searchDepth": "many"}), 400,
     'malformed parameter query.searchDepth: strconv.Atoi: parsing "many": invalid syntax'),
    (window(**{"query.serviceName": "llm", "query.attributes": '{"http.status_code": 200}'}), 400,
     "malformed parameter query.attributes: json: cannot unmarshal number into Go value of type string"),
    (window(), 400, "this storage backend requires a service name to search; searching all services is not supported"),
    (window(**{"query.serviceName": "llm", "query.searchDepth": "0"}), 400, "limit must be greater than 0"),
])
def test_bad_searches_get_jaegers_error_body_and_wording(api, traces, params, status, message):
    assert error(api, "/api/v3/trace-summaries", status, **params).startswith(message)
    assert error(api, "/api/v3/traces", status, **params).startswith(message)


def test_traces_as_otlp_json(api, store, traces):
    doc = ok(api, f"/api/v3/traces/{tid(4).hex()}")
    resource_spans = doc["result"]["resourceSpans"]
    services = [next(a["value"]["stringValue"] for a in rs["resource"]["attributes"] if a["key"] == "service.name")
                for rs in resource_spans]
    assert services == ["gateway", "llm"]  # one entry per resource, in the trace's order
    spans = [s for rs in resource_spans for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(spans) == 7
    chat = next(s for s in spans if s["name"] == "chat m")
    assert chat["traceId"] == tid(4).hex() and chat["spanId"] == sid(4, 2).hex()  # hex, not base64
    assert chat["parentSpanId"] == sid(4, 1).hex()
    assert chat["startTimeUnixNano"] == str(T0_NS + 3 * 10**9) and chat["kind"] == 1  # strings, integer enums
    assert chat["events"][0]["name"] == "first_token" and isinstance(chat["events"][0]["timeUnixNano"], str)
    keys = [a["key"] for a in chat["attributes"]]
    assert keys == sorted(keys)  # Jaeger's adjuster sorts; rawTraces keeps them as received
    raw = ok(api, f"/api/v3/traces/{tid(4).hex()}", rawTraces="true")["result"]["resourceSpans"]
    raw_chat = next(s for rs in raw for ss in rs["scopeSpans"] for s in ss["spans"] if s["name"] == "chat m")
    assert [a["key"] for a in raw_chat["attributes"]][0] == "gen_ai.operation.name" != keys[0]
    assert resource_spans[0]["scopeSpans"][0]["scope"] == {"name": "otel_llm", "version": "0.1.0"}
    lost = next(s for s in spans if s["name"] == "lost")
    assert lost["status"] == {"code": 2} and "kind" not in lost  # unspecified kind: 0, left out as protobuf JSON does
    # the same trace by base64 id (std and URL-safe), and a short hex id is left-padded
    b64 = base64.b64encode(tid(4)).decode()
    assert ok(api, f"/api/v3/traces/{urllib.parse.quote(b64, safe='')}") == doc
    assert ok(api, f"/api/v3/traces/{base64.urlsafe_b64encode(tid(4)).decode().rstrip('=')}") == doc
    assert ok(api, f"/api/v3/traces/{tid(4).hex().lstrip('0')}") == doc
    searched = ok(api, "/api/v3/traces", **window(**{"query.serviceName": "llm", "query.searchDepth": "2"}))
    ids = {s["traceId"] for rs in searched["result"]["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}
    assert ids == {tid(4).hex(), tid(3).hex()}  # every matching trace's spans in one list


def test_what_is_not_found_answers_as_jaeger_does(api, traces):
    assert error(api, f"/api/v3/traces/{tid(77).hex()}", 404) == "No traces found"
    assert error(api, "/api/v3/traces", 404, **window(**{"query.serviceName": "nobody"})) == "No traces found"
    assert error(api, "/api/v3/traces/not-an-id!", 400).startswith("malformed parameter trace_id")
    assert error(api, f"/api/v3/traces/{tid(4).hex()}", 400, startTime="soon").startswith(
        "malformed parameter startTime")
    assert get(api, "/api/v3/dependencies") == (404, "text/plain; charset=utf-8", b"404 page not found\n")


def test_go_value_parsers():
    assert duration_ns("1h2m3.5s") == (3723 * 10**9 + 5 * 10**8) and duration_ns("-2us") == -2000
    assert duration_ns("0") == 0 and duration_ns("1.5µs") == 1500
    for bad in ("", "1", "1 s", "s", "1d", "--1s"):
        with pytest.raises(ValueError, match="time: invalid duration"):
            duration_ns(bad)
    assert [parse_bool(t) for t in ("1", "t", "TRUE", "0", "f", "False")] == [True] * 3 + [False] * 3
    with pytest.raises(ValueError, match="invalid syntax"):
        parse_bool("yes")
    assert rfc3339_ns("1970-01-01T00:00:01.000000001Z") == 10**9 + 1
    assert rfc3339_ns("2026-09-21T16:13:20+02:00") == T0_NS
    for bad in ("2026-09-21", "2026-02-30T00:00:00Z", "2026-09-21T24:00:00Z", "2026-09-21T10:00:00.1234567891Z"):
        with pytest.raises(ValueError, match="parsing time"):
            rfc3339_ns(bad)
