"""The Jaeger UI's Deep Dependency Graph (``GET /analytics/v1/dependencies?service=&operation=
&start=&end=``), computed from the stored traces that pass through the focal service (and operation).

In each trace, a *hop* is a span whose parent is another service's span, or none: a call entering a
service (a server span, a pipeline stage's request), named by its service and its span's name. A
hop's parent hop is the hop its parent span belongs to. The graph's paths are the trace's root-to-
leaf chains of hops that contain the focal hop; the same path from many traces is listed once,
with its most recent trace as ``exemplar_trace_id``. The answer is the UI's `TDdgPayload`:
``{"dependencies": [{"path": [{"service", "operation"}], "attributes": [{"key", "value"}]}]}``.
``start``/``end`` are ms since the epoch (0 or missing: the last 24 hours); at most ``TRACES``
traces, the newest, are read. Jaeger itself serves sample data there; the UI's menu for it is off
by default (``deepDependencies.menuEnabled``).
"""

from __future__ import annotations

import time

from otel_llm.collector.tracestore.query import StoredSpan, TraceQuery, service_name
from otel_llm.collector.tracestore.store import TraceStore

TRACES = 500
_DAY_MS = 24 * 3600 * 1000


def deep_dependencies(store: TraceStore, service: str, operation: str, start_ms: int, end_ms: int) -> dict:
    if not service:
        raise ValueError("parameter 'service' is required")
    end_ms = end_ms or time.time_ns() // 1_000_000
    start_ms = start_ms or end_ms - _DAY_MS
    if start_ms > end_ms:
        raise ValueError("invalid parameter: start time must be before end time")
    traces = store.find_traces(TraceQuery(service, operation, start_ms * 1000, end_ms * 1000, limit=TRACES))
    paths: dict[tuple[tuple[str, str], ...], str] = {}
    for spans in traces:  # newest first: the first trace seen for a path is its exemplar
        for path in hop_paths(spans):
            if any(s == service and (not operation or op == operation) for s, op in path):
                paths.setdefault(path, spans[0].span.trace_id.hex())
    return {"dependencies": [{"path": [{"service": s, "operation": op} for s, op in path],
                              "attributes": [{"key": "exemplar_trace_id", "value": trace_id}]}
                             for path, trace_id in paths.items()]}


def hop_paths(spans: list[StoredSpan]) -> list[tuple[tuple[str, str], ...]]:
    """The trace's root-to-leaf chains of hops, each hop (service, its entry span's name)."""
    by_id = {s.span.span_id: s for s in spans}
    services = {s.span.span_id: service_name(s.resource) for s in spans}
    hop_of: dict[bytes, bytes] = {}  # span id -> the id of the hop span it belongs to

    def hop(span_id: bytes) -> bytes:
        chain = []
        while span_id not in hop_of:
            if len(chain) > len(spans):  # parent ids in a cycle: the span is its own hop
                hop_of[span_id] = span_id
                break
            stored = by_id[span_id]
            parent = stored.span.parent_span_id
            if not parent or parent not in by_id or services[parent] != services[span_id]:
                hop_of[span_id] = span_id
                break
            chain.append(span_id)
            span_id = parent
        for s in chain:
            hop_of[s] = hop_of[span_id]
        return hop_of[span_id]

    children: dict[bytes | None, list[bytes]] = {}
    for s in spans:
        span_id = s.span.span_id
        if hop(span_id) != span_id:
            continue  # not a hop: a span inside one
        parent = s.span.parent_span_id
        children.setdefault(hop(parent) if parent in by_id else None, []).append(span_id)
    out: list[tuple[tuple[str, str], ...]] = []

    def walk(span_id: bytes, prefix: tuple[tuple[str, str], ...]) -> None:
        path = prefix + ((services[span_id], by_id[span_id].span.name),)
        kids = children.get(span_id, [])
        if not kids:
            out.append(path)
        for kid in kids:
            if len(path) < 64:  # (a cycle of ids cannot recurse forever)
                walk(kid, path)
    for root in children.get(None, []):
        walk(root, ())
    return out
