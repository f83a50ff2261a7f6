"""Jaeger's query API v3 over HTTP, as Jaeger v2.19+ answers it and its current UI calls it.

The contract is Jaeger's own (jaegertracing/jaeger `cmd/jaeger/internal/extension/jaegerquery/
internal/apiv3/http_gateway.go`, `query_parser.go`, the jaeger-idl `api_v3` protos; the UI's
`src/api/v3/client.ts`), a hand-written handler that imitates grpc-gateway:

- ``GET /api/v3/services`` -> ``{"services": [...]}`` (the key even when empty: the UI requires it).
- ``GET /api/v3/operations?service=&spanKind=`` -> ``{"operations": [{"name", "spanKind"}]}``, kinds
  lowercase, an unspecified kind as ``internal``.
- ``GET /api/v3/trace-summaries?query.*`` (the UI's search) -> ``{"summaries": [...]}``, one per trace:
  ``traceId`` (32 hex), ``minStartTimeUnixNano``/``maxEndTimeUnixNano`` (decimal strings), span,
  error-span and orphan-span counts (left out when 0), the root span's service and operation, and
  per service its span and error counts; ``[]`` when nothing matches.
- ``GET /api/v3/traces?query.*`` -> ``{"result": {"resourceSpans": [...]}}``, OTLP/JSON (hex ids,
  times as decimal strings, enums as integers), every matching trace in one list;
  ``GET /api/v3/traces/{trace_id}`` (hex, or base64 of at most 24 characters) the same for one trace.
  Both answer 404 ``No traces found`` when there is none.

Search parameters (camelCase; the snake_case names Jaeger still reads are read too):
``query.serviceName`` (required: this store searches per service), ``query.operationName``,
``query.startTimeMin``/``query.startTimeMax`` (required, RFC 3339 with up to 9 fraction digits),
``query.durationMin``/``query.durationMax`` (Go durations), ``query.searchDepth`` (traces, default
100), ``query.attributes`` (a JSON object of strings: ``error``, ``span.kind``, ``scope.name``,
``scope.version``, ``span.status`` and ``resource.<key>`` as Jaeger reads them, any other key an
attribute of the span, its resource or its events), ``query.rawTraces`` (attributes as received,
else sorted by key as Jaeger's adjuster does). An error answers ``{"error": {"httpCode",
"message"}}`` as text/plain, Jaeger's wording; an unknown ``/api/v3`` path plain ``404 page not found``.
"""

from __future__ import annotations

import base64
import binascii
import json
from urllib.parse import unquote

from google.protobuf import json_format
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_llm.collector.extension.go_values import duration_ns, parse_bool, query_param, rfc3339_ns
from otel_llm.collector.tracestore.query import SPAN_KINDS, StoredSpan, TraceQuery, service_name
from otel_llm.collector.tracestore.store import TraceStore

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
DEFAULT_SEARCH_DEPTH = 100
_NO_SERVICE = "this storage backend requires a service name to search; searching all services is not supported"
_STATUS = {"ok": "OK", "error": "ERROR"}  # span.status values -> Jaeger v1's otel.status_code
_IDS = ("traceId", "spanId", "parentSpanId")


class _V3Error(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def v3_response(store: TraceStore, parts: list[str], params: dict[str, list[str]]) -> tuple[int, str, bytes]:
    """(status, content type, body) for ``/api/v3/...`` (``parts``: the path's segments, still escaped)."""
    try:
        match parts:
            case ["api", "v3", "services"]:
                body = {"services": store.services()}
            case ["api", "v3", "operations"]:
                body = {"operations": _operations(store, query_param(params, "service"),
                                                  query_param(params, "spanKind", "span_kind"))}
            case ["api", "v3", "trace-summaries"]:
                body = {"summaries": [summary(spans) for spans in store.find_traces(_query(params))]}
            case ["api", "v3", "traces"]:
                raw = _bool(params, "query.rawTraces", "query.raw_traces")
                body = _traces(store.find_traces(_query(params)), raw)
            case ["api", "v3", "traces", trace_id] if trace_id:
                for names in (("startTime", "start_time"), ("endTime", "end_time")):
                    _time(params, *names)
                raw = _bool(params, "rawTraces", "raw_traces")
                body = _traces([store.trace(_trace_id_hex(unquote(trace_id)))], raw)
            case _:
                return 404, TEXT, b"404 page not found\n"
    except _V3Error as exc:
        error = {"error": {"httpCode": exc.status, "message": exc.message}}
        return exc.status, TEXT, json.dumps(error, ensure_ascii=False).encode() + b"\n"
    return 200, JSON, json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _operations(store: TraceStore, service: str, kind: str) -> list[dict]:
    kind = kind.lower()
    if kind and kind not in SPAN_KINDS:
        return []  # as Jaeger's storages: a kind no span has
    return [{"name": op.name, "spanKind": op.span_kind or "internal"} for op in store.operations(service, kind or None)]


# -- parameters ----------------------------------------------------------------------------------

def _named(params, names: tuple[str, ...]) -> tuple[str, str]:
    """(the name the client used, its value)."""
    return next(((n, params[n][0]) for n in names if params.get(n, [""])[0] != ""), (names[0], ""))


def _parsed(params, names: tuple[str, ...], parse):
    """`parse` of the first of `names` given (None when none is); a 400 naming the parameter for a bad value."""
    name, text = _named(params, names)
    if text == "":
        return None
    try:
        return parse(text)
    except ValueError as exc:
        raise _V3Error(400, f"malformed parameter {name}: {exc}") from None


def _bool(params, *names: str) -> bool:
    return bool(_parsed(params, names, parse_bool))


def _time(params, *names: str) -> int | None:
    return _parsed(params, names, rfc3339_ns)


def _duration_us(params, *names: str) -> int | None:
    return _parsed(params, names, lambda text: duration_ns(text) // 1000)


def _query(params: dict[str, list[str]]) -> TraceQuery:
    """Jaeger's `parseFindTracesQuery`: the search as the trace store runs it."""
    start, end = _time(params, "query.startTimeMin", "query.start_time_min"), \
        _time(params, "query.startTimeMax", "query.start_time_max")
    if start is None or end is None:
        raise _V3Error(400, "query.startTimeMin and query.startTimeMax are required")
    if start >= end:
        raise _V3Error(400, "query.startTimeMin must be before query.startTimeMax")
    name, depth = _named(params, ("query.searchDepth", "query.search_depth", "query.num_traces"))
    try:
        limit = int(depth) if depth else DEFAULT_SEARCH_DEPTH
    except ValueError:
        raise _V3Error(400, f'malformed parameter {name}: strconv.Atoi: parsing "{depth}": invalid syntax') from None
    service = query_param(params, "query.serviceName", "query.service_name")
    if not service:
        raise _V3Error(400, _NO_SERVICE)
    min_us = _duration_us(params, "query.durationMin", "query.duration_min")
    max_us = _duration_us(params, "query.durationMax", "query.duration_max")
    try:
        return TraceQuery(service, query_param(params, "query.operationName", "query.operation_name"),
                          -(-start // 1000), end // 1000, min_us or 0, max_us, _attributes(params), limit)
    except ValueError as exc:
        raise _V3Error(400, str(exc)) from None


def _attributes(params) -> dict[str, str]:
    """``query.attributes`` (a JSON object of strings) in the trace store's tag words."""
    text = query_param(params, "query.attributes")
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise _V3Error(400, f"malformed parameter query.attributes: {exc}") from None
    if not isinstance(parsed, dict):
        raise _V3Error(400, f"malformed parameter query.attributes: json: cannot unmarshal "
                            f"{type(parsed).__name__} into Go value of type map[string]string")
    tags = {}
    for key, value in parsed.items():
        if not isinstance(value, str):
            raise _V3Error(400, f"malformed parameter query.attributes: json: cannot unmarshal "
                                f"{_go_type(value)} into Go value of type string")
        if key in ("scope.name", "scope.version"):
            key = "otel." + key
        elif key == "span.status":
            key, value = "otel.status_code", _STATUS.get(value.lower(), value)
        elif key.startswith("resource."):
            key = key[len("resource."):]
        tags[key] = value
    return tags


def _go_type(value) -> str:
    return "bool" if isinstance(value, bool) else "number" if isinstance(value, (int, float)) else \
        "array" if isinstance(value, list) else "object" if isinstance(value, dict) else "null"


def _trace_id_hex(text: str) -> str:
    """Jaeger's TraceIDFromString: up to 32 hex digits, or base64 (std or URL-safe, padded or not)."""
    if 1 <= len(text) <= 32 and all(c in "0123456789abcdefABCDEF" for c in text):
        return text
    if len(text) <= 24:
        try:
            raw = base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True)
            if 1 <= len(raw) <= 16:
                return raw.hex()
        except (binascii.Error, ValueError):
            pass
    raise _V3Error(400, f"malformed parameter trace_id: cannot parse trace ID {text!r}")


# -- answers -------------------------------------------------------------------------------------

def summary(spans: list[StoredSpan]) -> dict:
    """Jaeger's `summarizeTrace`: counts, time span, root and services of one trace (0 and "" left out)."""
    ids = {s.span.span_id for s in spans}
    services: dict[str, list[int]] = {}
    errors = orphans = 0
    root = None
    for stored in spans:
        span = stored.span
        failed = span.status.code == trace_pb2.Status.STATUS_CODE_ERROR
        counts = services.setdefault(service_name(stored.resource), [0, 0])
        counts[0] += 1
        counts[1] += failed
        errors += failed
        if not span.parent_span_id:
            if root is None or span.start_time_unix_nano < root.span.start_time_unix_nano:
                root = stored
        elif span.parent_span_id not in ids:
            orphans += 1
    out = {"traceId": spans[0].span.trace_id.hex(),
           "minStartTimeUnixNano": str(min(s.span.start_time_unix_nano for s in spans)),
           "maxEndTimeUnixNano": str(max(s.span.end_time_unix_nano for s in spans)),
           "spanCount": len(spans), "errorSpanCount": errors, "orphanSpanCount": orphans,
           "rootServiceName": service_name(root.resource) if root else "",
           "rootOperationName": root.span.name if root else "",
           "services": [_nonzero({"name": name, "spanCount": n, "errorSpanCount": e}, keep="name")
                        for name, (n, e) in sorted(services.items())]}
    return _nonzero(out, keep="services")


def _nonzero(d: dict, keep: str) -> dict:
    return {k: v for k, v in d.items() if k == keep or v not in (0, "")}


def _traces(traces: list[list[StoredSpan]], raw: bool) -> dict:
    """OTLP/JSON ``{"result": TracesData}`` of every span of ``traces``; 404 when there is none."""
    data = trace_pb2.TracesData()
    for spans in traces:  # per trace: one ResourceSpans per resource, one ScopeSpans per scope in it
        by_resource: dict[int, trace_pb2.ResourceSpans] = {}
        by_scope: dict[tuple[int, int], trace_pb2.ScopeSpans] = {}
        for stored in spans:
            key = (id(stored.resource), id(stored.scope))  # the store's parsed rows: one object per row
            scope_spans = by_scope.get(key)
            if scope_spans is None:
                rs = by_resource.get(key[0])
                if rs is None:
                    rs = by_resource[key[0]] = data.resource_spans.add()
                    rs.resource.CopyFrom(stored.resource)
                    rs.resource.SetInParent()  # written as {} when empty, as Jaeger does
                scope_spans = by_scope[key] = rs.scope_spans.add()
                scope_spans.scope.CopyFrom(stored.scope)
                scope_spans.scope.SetInParent()
            scope_spans.spans.add().CopyFrom(stored.span)
    if not data.resource_spans:
        raise _V3Error(404, "No traces found")
    if not raw:
        _sort_attributes(data)
    document = json_format.MessageToDict(data, use_integers_for_enums=True)
    _base64_ids_to_hex(document)
    return {"result": document}


def _sort_attributes(data: trace_pb2.TracesData) -> None:
    """Jaeger's SortCollections adjuster: resource, scope, span, event and link attributes by key."""
    def by_key(attributes) -> None:
        ordered = sorted(attributes, key=lambda kv: kv.key)
        if [kv.key for kv in ordered] != [kv.key for kv in attributes]:
            copies = [type(kv)() for kv in ordered]
            for copy, kv in zip(copies, ordered):
                copy.CopyFrom(kv)
            del attributes[:]
            attributes.extend(copies)

    for rs in data.resource_spans:
        by_key(rs.resource.attributes)
        for ss in rs.scope_spans:
            by_key(ss.scope.attributes)
            for span in ss.spans:
                by_key(span.attributes)
                for item in (*span.events, *span.links):
                    by_key(item.attributes)


def _base64_ids_to_hex(node) -> None:
    """Protobuf's JSON writes bytes as base64; OTLP/JSON writes trace and span ids as hex."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _IDS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _base64_ids_to_hex(value)
    elif isinstance(node, list):
        for item in node:
            _base64_ids_to_hex(item)
