"""What the trace store answers in, and how it matches: Jaeger's search (`TraceQuery`), the stored
span as it comes back (`StoredSpan`), operations, request summaries for the LLM questions, and
the rules Jaeger applies to service names, trace ids and tag matching (contrib translator and
Jaeger v2 query semantics; see shared/reference/collector-facts.md section 5).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1 import trace_pb2

SPAN_KINDS = ("", "internal", "server", "client", "producer", "consumer")  # Jaeger's words by OTLP enum
NO_SERVICE_NAME = "OTLPResourceNoServiceName"  # what Jaeger's translator calls a resource without attributes
DERIVED_TAGS = frozenset(("otel.scope.name", "otel.scope.version", "span.kind", "otel.status_code", "error",
                           "otel.status_description", "w3c.tracestate"))  # Jaeger tags not stored as attributes


@dataclass(frozen=True)
class TraceQuery:
    """Jaeger's search: traces with at least one span of ``service`` matching every given
    criterion (``operation`` = span name, start in [start_us, end_us], duration bounds in µs,
    ``tags`` = span/resource/event attributes or Jaeger's own tags, compared as text), newest
    first, at most ``limit`` traces."""
    service: str
    operation: str = ""
    start_us: int = 0
    end_us: int = (1 << 63) - 1
    min_duration_us: int = 0
    max_duration_us: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    limit: int = 100

    def __post_init__(self) -> None:
        if not self.service:
            raise ValueError("parameter 'service' is required")
        if not isinstance(self.limit, int) or self.limit <= 0:
            raise ValueError(f"limit must be greater than 0, got {self.limit!r}")
        if self.start_us > self.end_us:
            raise ValueError(f"start ({self.start_us}) must be before end ({self.end_us})")
        if self.min_duration_us < 0 or (self.max_duration_us is not None and self.max_duration_us < 0):
            raise ValueError(f"durations must not be negative, got {self.min_duration_us}..{self.max_duration_us}")
        if self.max_duration_us is not None and self.max_duration_us < self.min_duration_us:
            raise ValueError(f"'maxDuration' ({self.max_duration_us} µs) should be greater than 'minDuration' "
                             f"({self.min_duration_us} µs)")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.tags.items()):
            raise ValueError(f"tags must map strings to strings, got {dict(self.tags)!r}")
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))


class StoredSpan(NamedTuple):
    span: trace_pb2.Span  # as received: ids, name, kind, times (ns), status, attributes, events, links
    resource: Resource
    scope: InstrumentationScope


class Operation(NamedTuple):
    name: str
    span_kind: str  # server|client|producer|consumer|internal, "" when unspecified


class RequestSummary(NamedTuple):
    trace_id: bytes
    span_id: bytes
    service: str
    operation: str  # the span's name
    start_us: int
    duration_us: int
    ttft_s: float | None
    e2e_s: float | None
    queue_s: float | None
    error: bool  # status ERROR or an error.type attribute
    error_type: str | None
    finish_reason: str | None  # first of gen_ai.response.finish_reasons


def service_name(resource: Resource) -> str:
    """Jaeger's process.serviceName for a resource (contrib translator rules)."""
    if not resource.attributes:
        return NO_SERVICE_NAME
    return next((kv.value.string_value for kv in resource.attributes if kv.key == "service.name"), "")


# resource attributes that name one process, in order of preference: OTel's, then vLLM's tracer's
# (vLLM's resources carry no service.instance.id; its pid tells its API-server processes apart)
_INSTANCE_KEYS = ("service.instance.id", "vllm.process_id")


def instance_id(resource: Resource) -> str:
    """The process a resource names (`service.instance.id`, else vLLM's `vllm.process_id`), "" if none."""
    attrs = {kv.key: kv.value for kv in resource.attributes if kv.key in _INSTANCE_KEYS}
    return next((str(plain_value(attrs[k])) for k in _INSTANCE_KEYS if k in attrs), "")


def parse_trace_id(text: str) -> bytes:
    """1-32 hex digits (Jaeger shortens ids whose high half is 0) -> 16 bytes; ValueError otherwise."""
    if not 1 <= len(text) <= 32 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise ValueError(f"cannot parse traceID {text!r}: expected 1 to 32 hex digits")
    return bytes.fromhex(text.rjust(32, "0"))


def plain_value(value: AnyValue):
    """An attribute value as JSON-ready Python (pcommon's AsRaw): arrays -> lists, maps -> dicts,
    bytes -> base64 text, integral doubles -> int (as Go prints them), NaN/Inf -> text."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: plain_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind == "double_value":
        d = value.double_value
        if not math.isfinite(d):
            return "NaN" if d != d else ("+Inf" if d > 0 else "-Inf")  # as Go's strconv writes them
        return int(d) if d.is_integer() and abs(d) < 1e21 else d
    return None if kind is None else getattr(value, kind)


def text_matches(value, text: str) -> bool:
    """Jaeger's tag search compares text: bools, numbers and JSON by their reading of ``text``."""
    if isinstance(value, bool):
        return text.lower() == ("true" if value else "false")
    if isinstance(value, (int, float)):
        try:
            return int(text) == value if isinstance(value, int) and text.lstrip("+-").isdigit() else float(text) == value
        except ValueError:
            return False
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False) == text
    return value == text


def span_matches(tags: Mapping[str, str], stored: StoredSpan) -> bool:
    """Each tag equals an attribute of the span, its resource or one of its events, or a tag
    Jaeger derives (scope, span.kind, otel.status_code, error, otel.status_description, w3c.tracestate)."""
    span, resource, scope = stored
    values: dict[str, list] = {}
    for kv in (*span.attributes, *resource.attributes, *(kv for e in span.events for kv in e.attributes)):
        if kv.key in tags:
            values.setdefault(kv.key, []).append(plain_value(kv.value))
    derived = {"otel.scope.name": scope.name, "otel.scope.version": scope.version,
               "span.kind": SPAN_KINDS[span.kind] if 0 <= span.kind < len(SPAN_KINDS) else "",
               "otel.status_code": ("", "OK", "ERROR")[span.status.code] if span.status.code in (1, 2) else "",
               "error": span.status.code == trace_pb2.Status.STATUS_CODE_ERROR or "",
               "otel.status_description": span.status.message, "w3c.tracestate": span.trace_state}
    for key, value in derived.items():
        if key in tags and value != "":
            values.setdefault(key, []).append(value)
    return all(any(text_matches(v, text) for v in values.get(key, ())) for key, text in tags.items())
