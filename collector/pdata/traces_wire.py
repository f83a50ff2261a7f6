"""A wire-compatible view of ExportTraceServiceRequest that keeps resources, scopes and spans
as serialized bytes: what the tail sampler holds while a trace waits for its decision, and
how it writes the kept spans out again without re-encoding them.

Field numbers are opentelemetry-proto's (trace/v1/trace.proto, collector/trace/v1); a view
message parses and serializes the same bytes as the real classes (built by `proto_classes`).
"""

from __future__ import annotations

from otel_llm.collector.pdata.proto_classes import message_classes

# message -> (field, number, repeated, type)
_MESSAGES = {
    "ExportTraceServiceRequest": [("resource_spans", 1, True, "ResourceSpans")],
    "ResourceSpans": [("resource", 1, False, "bytes"), ("scope_spans", 2, True, "ScopeSpans"),
                      ("schema_url", 3, False, "string")],
    "ScopeSpans": [("scope", 1, False, "bytes"), ("spans", 2, True, "bytes"), ("schema_url", 3, False, "string")],
}
TracesRequest = message_classes("otel_llm.collector.traces_wire", _MESSAGES)["ExportTraceServiceRequest"]


def encode_spans(groups: dict[tuple[bytes, bytes], list[bytes]]) -> bytes:
    """One request from serialized spans grouped by (serialized resource, serialized scope)."""
    request = TracesRequest()
    by_resource: dict[bytes, object] = {}
    for (resource, scope), spans in groups.items():
        rs = by_resource.get(resource)
        if rs is None:
            rs = by_resource[resource] = request.resource_spans.add(resource=resource)
        rs.scope_spans.add(scope=scope, spans=spans)
    return request.SerializeToString()
