"""Jaeger's HTTP query API (v1 JSON, as Jaeger <= v2.20 and Grafana's Jaeger data source speak
it) over a `TraceStore`, plus two LLM endpoints of our own. ``/api/v3/...``, what Jaeger's current
UI calls for services, operations and search, is `jaeger_api_v3`.

Jaeger endpoints (every answer is the envelope ``{"data", "total", "limit", "offset", "errors"}``):
- ``GET /api/services`` -> service names; ``GET /api/services/{service}/operations`` -> names;
  ``GET /api/operations?service=&spanKind=`` -> ``[{"name", "spanKind"}]``.
- ``GET /api/traces?service=&operation=&tags={json}&tag=k:v&minDuration=&maxDuration=&start=&end=&limit=``
  (start/end µs since epoch, default now-48h/now; durations as Go durations "1.5s", "100ms";
  limit default 100) or ``?traceID=..&traceID=..`` (missing ids listed in ``errors``).
- ``GET /api/traces/{traceID}`` -> ``[trace]``, 404 ``trace not found``. ``start``/``end``/``raw``
  are checked and then ignored (Grafana sends start/end in ms where Jaeger reads µs).
- ``GET /api/dependencies?endTs=&lookback=&service=`` (ms; default now and 24 h) -> ``[{"parent",
  "child", "callCount"}]``: calls from one service's span to another's (`tracestore.dependencies`),
  the System Architecture page.
- ``GET /api/metrics/{latencies,calls,errors}``: the Monitor tab's series (`jaeger_metrics`), a
  MetricFamily, not the envelope.
- ``GET /analytics/v1/dependencies?service=&operation=&start=&end=``: the Deep Dependency Graph's
  paths through a service (`deep_dependencies`; its own JSON, not the envelope).
- ``POST /api/transform`` (the UI's Upload): an OTLP/JSON body (ExportTraceServiceRequest) ->
  its traces in Jaeger's JSON, as the trace view reads them; ``POST /api/archive/{id}``: 501, no
  archive storage.
Trace JSON follows Jaeger's uimodel and the contrib OTLP->Jaeger translator: tags in the order
scope, attributes, span.kind, otel.status_code, error, otel.status_description, w3c.tracestate.
Unless ``raw=true``, attributes (span, resource, event) are sorted by key and logs by time, as
Jaeger v2's SortCollections adjuster does; with it they come as received.

LLM endpoints (``data`` = request summaries ``{"traceID", "spanID", "service", "operation",
"startTime" (µs), "duration" (µs), "ttftSeconds", "e2eSeconds", "queueSeconds" (null when
unknown), "error", "errorType", "finishReason"}``):
- ``GET /api/llm/slowest?metric=ttft|e2e|queue&lookback=5m&limit=20``: largest first, among the
  requests that started in the last ``lookback`` (Go duration).
- ``GET /api/llm/failed?start=&end=&limit=100``: errored/aborted requests, newest first
  (start/end µs, default now-48h/now).
- ``GET /api/llm/timeline?start=&end=&lookback=15m&limit=1000&model=&instance=&finishReason=&ttftAbove=&e2eAbove=``:
  the request timeline (`otel_llm.collector.timeline.rows`) of the requests that started in [start, end] (µs;
  end defaults to now, start to end - lookback), from the first ``limit`` traces: ``data`` =
  ``{"start", "end", "truncated" (more traces started in the window), "requests" (rows before
  filtering), "models", "instances", "finishReasons" (their distinct non-empty values), "rows"
  (`TimelineRow.as_json` of the rows matching every filter; thresholds in seconds, exclusive),
  "load" (`LoadPoint.as_json`, of those rows), "lanes" (`Lane.as_json`: the engine lane's steps from
  start to the last row's end, of the filter's model and instance; `otel_llm.collector.timeline.lanes`)}``;
  ``total`` = rows shown.
- ``GET /api/llm/heatmap?start=&end=&lookback=15m&metric=ttft|e2e|queue|itl&service=&columns=240``: the overview
  of every request that started in the window, from the store's aggregates (`otel_llm.collector.tracestore.
  request_heat.heatmap`: latency cells per column of whole 10 s steps, failed, aborted and preempted counts, the
  mean requests waiting and running per column); ``total`` = the requests counted.

``GET /ui`` (and ``/ui/...``) serves the timeline web view (`otel_llm.collector.extension.web_ui`), HTML, not JSON.

Bad input answers 400 with the envelope's ``errors[0].msg`` saying what was wrong; unknown paths
404. Threads: one accepting thread, one daemon thread per connection; the store is thread-safe.

Size: the API's endpoints are small handlers over one `HttpEndpoint`; most of the length is the
contract above.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from urllib.parse import parse_qs, unquote_plus, urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.collector.extension.deep_dependencies import deep_dependencies
from otel_llm.collector.extension.go_values import duration_ns, parse_bool, query_param
from otel_llm.collector.extension.jaeger_api_v3 import v3_response
from otel_llm.collector.extension.jaeger_metrics import METRICS, metric_family
from otel_llm.collector.extension.web_ui import ui_response
from otel_llm.collector.http_connection import EndpointHandler
from otel_llm.collector.http_endpoint import HttpEndpoint, HttpServerSettings
from otel_llm.collector.pdata import otlp_codec
from otel_llm.collector.timeline.lanes import timeline_lanes
from otel_llm.collector.timeline.rows import RowFilter, load, rows_from_traces
from otel_llm.collector.tracestore.query import (
    SPAN_KINDS, RequestSummary, StoredSpan, TraceQuery, parse_trace_id, plain_value, service_name,
)
from otel_llm.collector.tracestore.request_heat import MAX_COLUMNS
from otel_llm.collector.tracestore.store import TraceStore

logger = logging.getLogger(__name__)

_MAX_SAFE_INT = (1 << 53) - 1
_DEFAULT_LOOKBACK_US = 48 * 3600 * 1_000_000
_TIMELINE_LOOKBACK_US = 15 * 60 * 1_000_000
_DEPENDENCY_LOOKBACK_MS = 24 * 3600 * 1000  # Jaeger's default
_TRANSFORM_LIMIT = 16 * 1024 * 1024


class JaegerQueryApi(HttpEndpoint):
    """Serves the endpoints above for ``store`` on ``host:port`` (0 = any free port) until stopped."""

    def __init__(self, store: TraceStore, host: str = "127.0.0.1", port: int = 0,
                 settings: HttpServerSettings | None = None) -> None:
        self.store = store
        super().__init__(type("_BoundHandler", (_Handler,), {"store": store}), host, port, "jaeger-query", settings)

    @property
    def url(self) -> str:
        return self.base_url


class _HttpError(Exception):
    def __init__(self, status: int, msg: str) -> None:
        super().__init__(msg)
        self.status, self.msg = status, msg


class _Handler(EndpointHandler):
    store: TraceStore

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        params = parse_qs(url.query, keep_blank_values=True)
        parts = url.path.split("/")[1:]  # still escaped: a service name may hold "%2F"
        if parts[0] == "ui":
            ui = ui_response(parts[1:])
            self.send(ui.status, ui.content_type, ui.body, () if ui.location is None else (("Location", ui.location),))
            return
        if parts[:2] == ["api", "v3"]:
            self.send(*v3_response(self.store, parts, params))
            return
        try:
            response = self._route(parts, params)
            status = 200
        except _HttpError as exc:
            status, response = exc.status, _envelope(None, errors=[{"code": exc.status, "msg": exc.msg}])
        except Exception:
            logger.exception("Jaeger query %s failed", self.path)
            status, response = 500, _envelope(None, errors=[{"code": 500, "msg": "internal error, see the collector log"}])
        pretty = params.get("prettyPrint", [""])[0] not in ("", "false")
        body = json.dumps(response, indent=4 if pretty else None, separators=None if pretty else (",", ":"),
                          ensure_ascii=False, allow_nan=False).encode()
        self.send(status, "application/json", body)

    def do_POST(self) -> None:
        """``/api/transform``: OTLP/JSON traces (the UI's Upload) -> Jaeger's JSON; the rest refused in JSON."""
        path = urlsplit(self.path).path
        if path != "/api/transform":
            self.discard(_TRANSFORM_LIMIT)
            if path.startswith("/api/archive/"):
                self.deny(501, "archive storage is not configured: the collector's trace store has no archive")
            else:
                self.deny(404, f"unknown path {path!r} for POST; see /api/transform")
            return
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self.close_connection = True
            self.deny(411, "Content-Length required")
            return
        if int(length) > _TRANSFORM_LIMIT:
            self.discard(_TRANSFORM_LIMIT)
            self.deny(413, f"body of {length} bytes exceeds the limit of {_TRANSFORM_LIMIT} bytes")
            return
        try:
            request = otlp_codec.decode(self.rfile.read(int(length)), otlp_codec.JSON, ExportTraceServiceRequest)
        except otlp_codec.PayloadError as exc:
            self.deny(400, exc.reason)
            return
        traces: dict[bytes, list[StoredSpan]] = {}
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    traces.setdefault(span.trace_id, []).append(StoredSpan(span, rs.resource, ss.scope))
        data = [trace_json(sorted(spans, key=lambda s: s.span.start_time_unix_nano)) for spans in traces.values()]
        self.send(200, "application/json", json.dumps(_envelope(data, total=len(data)), ensure_ascii=False,
                                                      allow_nan=False).encode())

    def deny(self, status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        body = json.dumps(_envelope(None, errors=[{"code": status, "msg": reason}])).encode()
        self.send(status, "application/json", body, headers)

    def _route(self, parts: list[str], params: dict[str, list[str]]) -> dict:
        store = self.store
        match parts:
            case ["api", "services"]:
                services = store.services()
                return _envelope(services, total=len(services))
            case ["api", "services", service, "operations"] if service:
                names = list(dict.fromkeys(op.name for op in store.operations(unquote_plus(service))))
                return _envelope(names, total=len(names))
            case ["api", "operations"]:
                service, kind = query_param(params, "service"), query_param(params, "spanKind")
                if not service:
                    raise _HttpError(400, "parameter 'service' is required")
                if kind and kind not in SPAN_KINDS:
                    raise _HttpError(400, f"unsupported span kind: '{kind}'")
                ops = [{"name": op.name, "spanKind": op.span_kind} for op in store.operations(service, kind or None)]
                return _envelope(ops, total=len(ops))
            case ["api", "traces"]:
                return _search(store, params)
            case ["api", "traces", trace_id] if trace_id:
                for name in ("start", "end"):
                    _int(params, name, 0)
                raw = _bool(params, "raw")
                spans = store.trace(_trace_id(unquote_plus(trace_id)))
                if not spans:
                    raise _HttpError(404, "trace not found")
                return _envelope([trace_json(spans, raw)])
            case ["api", "dependencies"]:
                end_ms = _int(params, "endTs", _now_us() // 1000)
                lookback_ms = _int(params, "lookback", _DEPENDENCY_LOOKBACK_MS)
                links = store.dependencies((end_ms - lookback_ms) * 1000, end_ms * 1000, query_param(params, "service"))
                return _envelope([{"parent": p, "child": c, "callCount": n} for p, c, n in links])
            case ["analytics", "v1", "dependencies"]:
                try:
                    return deep_dependencies(store, query_param(params, "service"), query_param(params, "operation"),
                                             _int(params, "start", 0), _int(params, "end", 0))
                except ValueError as exc:
                    raise _HttpError(400, str(exc)) from None
            case ["api", "metrics", metric] if metric in METRICS:
                try:
                    return metric_family(store, metric, params)
                except ValueError as exc:
                    raise _HttpError(400, str(exc)) from None
            case ["api", "llm", "slowest"]:
                metric = query_param(params, "metric") or "ttft"
                if metric not in ("ttft", "e2e", "queue"):
                    raise _HttpError(400, f"unable to parse param 'metric': {metric!r} is not one of ttft, e2e, queue")
                since = _now_us() - _duration_us(params, "lookback", 300_000_000)
                return _summaries(store.slowest_requests(metric, since, _limit(params, 20)))
            case ["api", "llm", "failed"]:
                start, end = _time_range(params)
                return _summaries(store.failed_requests(start, end, _limit(params, 100)))
            case ["api", "llm", "timeline"]:
                return _timeline(store, params)
            case ["api", "llm", "heatmap"]:
                return _heatmap(store, params)
            case ["api", "llm", "bubbleup"]:
                return _bubbleup(store, params)
        raise _HttpError(404, f"unknown path {self.path.split('?', 1)[0]!r}; see /api/services, /api/traces, "
                              "/api/llm/slowest, /api/llm/failed, /api/llm/timeline, /api/llm/heatmap, /api/llm/bubbleup, /ui")


def _search(store: TraceStore, params: dict[str, list[str]]) -> dict:
    start, end = _time_range(params)
    limit, min_us = _limit(params, 100), _duration_us(params, "minDuration", 0)
    max_us = _duration_us(params, "maxDuration", 0) or None
    tags, raw = _tags(params), _bool(params, "raw")
    if max_us is not None and min_us and max_us < min_us:
        raise _HttpError(400, "'maxDuration' should be greater than 'minDuration'")
    ids = [_trace_id(t) for t in params.get("traceID", [])]
    if ids:
        traces, errors = [], []
        for trace_id in ids:
            spans = store.trace(trace_id)
            if spans:
                traces.append(trace_json(spans, raw))
            else:
                errors.append({"msg": "trace not found", "traceID": _jaeger_trace_id(parse_trace_id(trace_id))})
        return _envelope(traces, errors=errors or None)
    try:
        query = TraceQuery(query_param(params, "service"), query_param(params, "operation"), start, end, min_us, max_us, tags, limit)
    except ValueError as exc:
        raise _HttpError(400, str(exc)) from None
    return _envelope([trace_json(spans, raw) for spans in store.find_traces(query)])


def _timeline_window(params) -> tuple[int, int]:
    """The timeline's and the overview's window: ``start``/``end`` µs, end now and start ``lookback`` (15m) before."""
    end = _int(params, "end", _now_us())
    start = _int(params, "start", end - _duration_us(params, "lookback", _TIMELINE_LOOKBACK_US))
    if start > end:
        raise _HttpError(400, "invalid parameter: start time must be before end time")
    return start, end


def _timeline(store: TraceStore, params: dict[str, list[str]]) -> dict:
    start, end = _timeline_window(params)
    try:
        wanted = RowFilter(query_param(params, "model"), query_param(params, "instance"), query_param(params, "finishReason"),
                           _seconds(params, "ttftAbove"), _seconds(params, "e2eAbove"))
    except ValueError as exc:
        raise _HttpError(400, str(exc)) from None
    limit = _limit(params, 1000)
    try:
        matched, traces, chosen = store.choose_requests(start, end, limit, *_latency_range(params),
                                                        query_param(params, "service"))
    except ValueError as exc:
        raise _HttpError(400, str(exc)) from None
    rows = rows_from_traces(traces)  # by start
    shown = [row for row in rows if wanted.matches(row)]
    lanes = timeline_lanes(store, start, max([end] + [r.end_ns // 1000 for r in rows]), wanted)
    data = {"start": start, "end": end, "truncated": matched > limit, "matched": matched, "chosen": chosen,
            "requests": len(rows),
            "models": _distinct(r.model for r in rows), "instances": _distinct(r.instance for r in rows),
            "finishReasons": _distinct(r.finish_reason for r in rows),
            "rows": [row.as_json() for row in shown], "load": [point.as_json() for point in load(shown)],
            "lanes": [lane.as_json() for lane in lanes]}
    return _envelope(data, total=len(shown))


def _distinct(values) -> list[str]:
    return sorted({v for v in values if v})


def _latency_range(params) -> tuple[str | None, float | None, float | None]:
    """A region's latency range: ``metric`` and ``min``/``max`` seconds (min inclusive, max exclusive)."""
    return query_param(params, "metric") or None, _seconds(params, "min"), _seconds(params, "max")


def _bubbleup(store: TraceStore, params: dict[str, list[str]]) -> dict:
    start, end = _timeline_window(params)
    try:
        return _envelope(store.compare_requests(start, end, *_latency_range(params), query_param(params, "service")))
    except ValueError as exc:
        raise _HttpError(400, str(exc)) from None


def _heatmap(store: TraceStore, params: dict[str, list[str]]) -> dict:
    start, end = _timeline_window(params)
    columns = _int(params, "columns", MAX_COLUMNS)
    if not 1 <= columns <= MAX_COLUMNS:
        raise _HttpError(400, f"unable to parse param 'columns': {columns} is not from 1 to {MAX_COLUMNS}")
    try:
        data = store.heatmap(query_param(params, "metric") or "ttft", start, end, query_param(params, "service"), columns)
    except ValueError as exc:
        raise _HttpError(400, str(exc)) from None
    return _envelope(data, total=data["requests"])


def _envelope(data, total: int = 0, errors: list | None = None) -> dict:
    return {"data": data, "total": total, "limit": 0, "offset": 0, "errors": errors}


def _summaries(requests: list[RequestSummary]) -> dict:
    data = [{"traceID": _jaeger_trace_id(r.trace_id), "spanID": r.span_id.hex(), "service": r.service,
             "operation": r.operation, "startTime": r.start_us, "duration": r.duration_us, "ttftSeconds": r.ttft_s,
             "e2eSeconds": r.e2e_s, "queueSeconds": r.queue_s, "error": r.error, "errorType": r.error_type,
             "finishReason": r.finish_reason} for r in requests]
    return _envelope(data, total=len(data))


# -- parameters ----------------------------------------------------------------------------------

def _now_us() -> int:
    return time.time_ns() // 1000



def _int(params, name: str, default: int, bits: int = 64) -> int:
    """Go's strconv.ParseInt(text, 10, bits)."""
    text = query_param(params, name)
    if text == "":
        return default
    if not re.fullmatch(r"[+-]?[0-9]+", text) or not -(1 << bits - 1) <= int(text) < 1 << bits - 1:
        raise _HttpError(400, f"unable to parse param '{name}': {text!r} is not a {bits}-bit integer")
    return int(text)


def _bool(params, name: str) -> bool:
    text = query_param(params, name)
    try:
        return text != "" and parse_bool(text)
    except ValueError:
        raise _HttpError(400, f"unable to parse param '{name}': {text!r} is not a boolean") from None


def _limit(params, default: int) -> int:
    limit = _int(params, "limit", default, bits=32)
    if limit <= 0:
        raise _HttpError(400, "invalid parameter: limit must be greater than 0")
    return limit


def _seconds(params, name: str) -> float | None:
    text = query_param(params, name)
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        raise _HttpError(400, f"unable to parse param '{name}': {text!r} is not a number of seconds") from None


def _time_range(params) -> tuple[int, int]:
    now = _now_us()
    start, end = _int(params, "start", now - _DEFAULT_LOOKBACK_US), _int(params, "end", now)
    if start > end:
        raise _HttpError(400, "invalid parameter: start time must be before end time")
    return start, end


def _duration_us(params, name: str, default_us: int) -> int:
    """A Go duration string (time.ParseDuration: "1h2m", "1.5s", "300ms", "-2us", "0") in µs."""
    text = query_param(params, name)
    if text == "":
        return default_us
    try:
        return duration_ns(text) // 1000
    except ValueError as exc:
        raise _HttpError(400, f"unable to parse param '{name}': {exc}") from None


def _tags(params) -> dict[str, str]:
    tags = {}
    for tag in params.get("tag", []):
        key, sep, value = tag.partition(":")
        if not sep:
            raise _HttpError(400, f"malformed 'tag' parameter, expecting key:value, received: {tag}")
        tags[key] = value
    for text in params.get("tags", []):
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise _HttpError(400, f"malformed 'tags' parameter, cannot unmarshal JSON: {exc}") from None
        if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
            raise _HttpError(400, f"malformed 'tags' parameter, expecting a JSON object of strings, received: {text}")
        tags.update(parsed)
    return tags


def _trace_id(text: str) -> str:
    try:
        parse_trace_id(text)
    except ValueError as exc:
        raise _HttpError(400, str(exc)) from None
    return text


# -- Jaeger JSON ---------------------------------------------------------------------------------

def _jaeger_trace_id(trace_id: bytes) -> str:
    return trace_id[8:].hex() if not any(trace_id[:8]) else trace_id.hex()


def trace_json(spans: list[StoredSpan], raw: bool = False) -> dict:
    """One Jaeger trace: spans in the given order, processes p1, p2, ... by first appearance;
    ``raw`` keeps attributes and events in the order received (else sorted, as Jaeger does)."""
    processes, process_ids, out = {}, {}, []
    order = (lambda items, key: list(items)) if raw else sorted
    for stored in spans:
        process = {"serviceName": service_name(stored.resource), "tags": [
            _kv(kv.key, kv.value) for kv in order(stored.resource.attributes, key=_by_key) if kv.key != "service.name"]}
        key = json.dumps(process, sort_keys=True)
        if key not in process_ids:
            process_ids[key] = f"p{len(process_ids) + 1}"
            processes[process_ids[key]] = process
        out.append(_span_json(stored, process_ids[key], order))
    return {"traceID": _jaeger_trace_id(spans[0].span.trace_id), "spans": out, "processes": processes, "warnings": None}


def _by_key(kv) -> str:
    return kv.key


def _span_json(stored: StoredSpan, process_id: str, order) -> dict:
    span, scope = stored.span, stored.scope
    trace_id = _jaeger_trace_id(span.trace_id)
    references = []
    if span.parent_span_id:
        references.append({"refType": "CHILD_OF", "traceID": trace_id, "spanID": span.parent_span_id.hex()})
    for link in span.links:
        child_of = any(kv.key == "opentracing.ref_type" and kv.value.string_value == "child_of" for kv in link.attributes)
        ref_type = "CHILD_OF" if child_of else "FOLLOWS_FROM"
        if span.parent_span_id and link.trace_id == span.trace_id and link.span_id == span.parent_span_id:
            references[0]["refType"] = ref_type  # the translator lets a link to the parent set its type
            continue
        references.append({"refType": ref_type, "traceID": _jaeger_trace_id(link.trace_id), "spanID": link.span_id.hex()})
    tags = [_string(k, v) for k, v in (("otel.scope.name", scope.name), ("otel.scope.version", scope.version)) if v]
    tags += [_kv(kv.key, kv.value) for kv in order(span.attributes, key=_by_key)]
    if 0 < span.kind < len(SPAN_KINDS):
        tags.append(_string("span.kind", SPAN_KINDS[span.kind]))
    if span.status.code in (1, 2):
        tags.append(_string("otel.status_code", "OK" if span.status.code == 1 else "ERROR"))
    if span.status.code == 2:
        tags.append({"key": "error", "type": "bool", "value": True})
    if span.status.message:
        tags.append(_string("otel.status_description", span.status.message))
    if span.trace_state:
        tags.append(_string("w3c.tracestate", span.trace_state))
    logs = []
    for event in order(span.events, key=lambda e: e.time_unix_nano):
        fields = [_string("event", event.name)] if event.name and not any(
            kv.key == "event" for kv in event.attributes) else []
        logs.append({"timestamp": event.time_unix_nano // 1000,
                     "fields": fields + [_kv(kv.key, kv.value) for kv in order(event.attributes, key=_by_key)]})
    return {"traceID": trace_id, "spanID": span.span_id.hex(), "operationName": span.name, "references": references,
            "startTime": span.start_time_unix_nano // 1000,
            "duration": max(0, span.end_time_unix_nano - span.start_time_unix_nano) // 1000,
            "tags": tags, "logs": logs, "processID": process_id, "warnings": None}


def _string(key: str, value: str) -> dict:
    return {"key": key, "type": "string", "value": value}


def _kv(key: str, value) -> dict:
    """A Jaeger KeyValue for an OTLP AnyValue (translator types; uimodel's JSON values)."""
    kind = value.WhichOneof("value")
    if kind == "bool_value":
        return {"key": key, "type": "bool", "value": value.bool_value}
    if kind == "int_value":
        n = value.int_value
        return {"key": key, "type": "int64", "value": n if -_MAX_SAFE_INT <= n <= _MAX_SAFE_INT else str(n)}
    if kind == "double_value":
        d = value.double_value
        return {"key": key, "type": "float64", "value": d if math.isfinite(d) else plain_value(value)}
    if kind == "bytes_value":
        return {"key": key, "type": "binary", "value": plain_value(value)}
    if kind in ("array_value", "kvlist_value"):
        return _string(key, json.dumps(plain_value(value), separators=(",", ":"), ensure_ascii=False))
    return _string(key, value.string_value)
