"""A wire-compatible view of ExportTraceServiceRequest that keeps resources, scopes and spans
as serialized bytes: what the tail sampler holds while a trace waits for its decision, and
how it writes the kept spans out again without re-encoding them.

Field numbers are opentelemetry-proto's (trace/v1/trace.proto, collector/trace/v1); a view
message parses and serializes the same bytes as the real classes. Built at import time into
a private descriptor pool, like `otlp_metrics_wire`.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "otel_llm.collector.traces_wire"

# message -> (field, number, repeated, type: a scalar or a message of this file)
_MESSAGES = {
    "ExportTraceServiceRequest": [("resource_spans", 1, True, "ResourceSpans")],
    "ResourceSpans": [("resource", 1, False, "bytes"), ("scope_spans", 2, True, "ScopeSpans"),
                      ("schema_url", 3, False, "string")],
    "ScopeSpans": [("scope", 1, False, "bytes"), ("spans", 2, True, "bytes"), ("schema_url", 3, False, "string")],
}
_SCALARS = {"bytes": _F.TYPE_BYTES, "string": _F.TYPE_STRING}


def _file() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name="otel_llm/traces_wire.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = fdp.message_type.add(name=name)
        for field, number, repeated, type_ in fields:
            entry = message.field.add(name=field, number=number,
                                      label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
            if type_ in _SCALARS:
                entry.type = _SCALARS[type_]
            else:
                entry.type, entry.type_name = _F.TYPE_MESSAGE, f".{_PACKAGE}.{type_}"
    return fdp


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file())
TracesRequest = message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"{_PACKAGE}.ExportTraceServiceRequest"))


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
