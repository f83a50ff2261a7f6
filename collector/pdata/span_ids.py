"""The OTLP rules for a span's ids (opentelemetry-proto trace/v1/trace.proto): ``trace_id`` 16
bytes and not all zero, ``span_id`` 8 bytes and not all zero, ``parent_span_id`` empty (a root
span) or 8 bytes.

A span that breaks them cannot be looked up, linked or deduplicated: the traces pipeline refuses
it at the receiver (counted, answered as an OTLP partial success) and takes the request's other
spans; the trace store checks again and refuses a batch that holds one. Pure functions.

`ids_valid` proves a whole request keeps the rules without a Python step per span (checking each
span's fields from Python cost the collector's forwarding path a quarter of its spans per
CPU-second): the request is parsed into a view that declares only the ids (everything else is
an unknown field, then discarded), and each scope's spans, serialized again, are matched by one
regular expression. The serialization is canonical (fields in number order, each once, empty
bytes left out), so a valid span is exactly ``0a 10 <16 bytes> 12 08 <8 bytes>`` with
``22 08 <8 bytes>`` after it when it has a parent, prefixed by its tag and length (``12 1c`` or
``12 26``); the expression walks the spans record by record, each length pinned, so it can only
match when every record is a valid span.
"""

from __future__ import annotations

import re

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.collector.pdata.proto_classes import message_classes

_ZERO_TRACE_ID, _ZERO_SPAN_ID = bytes(16), bytes(8)
_IdsRequest = message_classes("otel_llm.collector.span_ids", {
    "ExportTraceServiceRequest": [("resource_spans", 1, True, "ResourceSpans")],
    "ResourceSpans": [("scope_spans", 2, True, "ScopeSpans")],
    "ScopeSpans": [("spans", 2, True, "SpanIds")],
    "SpanIds": [("trace_id", 1, False, "bytes"), ("span_id", 2, False, "bytes"),
                ("parent_span_id", 4, False, "bytes")],
})["ExportTraceServiceRequest"]
_VALID_SPANS = re.compile(  # a scope's spans, ids only, each one valid
    rb"(?:\x12\x1c\x0a\x10(?!\x00{16}).{16}\x12\x08(?!\x00{8}).{8}"
    rb"|\x12\x26\x0a\x10(?!\x00{16}).{16}\x12\x08(?!\x00{8}).{8}\x22\x08.{8})*", re.DOTALL)


def id_problem(span: Span) -> str:
    """Why ``span``'s ids break the rules, naming the field and its length (never its bytes, which
    can be anything a client sent); "" when they keep them."""
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    if len(trace_id) != 16:
        return f"trace_id is {len(trace_id)} bytes, not 16"
    if trace_id == _ZERO_TRACE_ID:
        return "trace_id is all zero"
    if len(span_id) != 8:
        return f"span_id is {len(span_id)} bytes, not 8"
    if span_id == _ZERO_SPAN_ID:
        return "span_id is all zero"
    if len(parent) not in (0, 8):
        return f"parent_span_id is {len(parent)} bytes, not 0 or 8"
    return ""


def ids_valid(payload: bytes) -> bool:
    """True when every span of ``payload`` (a serialized ExportTraceServiceRequest that parses)
    keeps the rules; False when one may not (then ask `id_problem` of each). About 0.2 us a span."""
    request = _IdsRequest.FromString(payload)
    request.DiscardUnknownFields()
    return all(_VALID_SPANS.fullmatch(ss.SerializeToString()) for rs in request.resource_spans
               for ss in rs.scope_spans)
