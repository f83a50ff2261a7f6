"""OTLP/protobuf encoding of SDK `ReadableSpan`s, written straight to wire bytes.

The SDK's encoder (`opentelemetry.exporter.otlp.proto.common.trace_encoder`)
builds a protobuf object per span, attribute and value and then serialises the
tree: ~45 us of Python per span here, and a streaming server exports five spans
per request from its own process. This module emits the same
`ExportTraceServiceRequest` bytes directly, caching what repeats (attribute keys,
resources, scopes): a few us per span. The tests parse both encodings with the
generated protobuf classes and require equal messages.

Values it does not know (anything but str, bool, int64, float, bytes, and
sequences or mappings of those) raise `TypeError`; `FastOTLPSpanExporter`
then falls back to the SDK's encoder for that batch.

A string UTF-8 cannot encode (a lone UTF-16 surrogate such as "\ud800", which JSON's escapes and
Python's str allow) never fails a batch: each such character is written as U+FFFD and counted
(`replaced_characters`), the rest of the string and of the batch as they are.

`FastOTLPSpanExporter` is the SDK's OTLP/HTTP span exporter (endpoint, headers,
compression, timeout, retries: all its own) sending these bytes.
"""

from __future__ import annotations

import codecs
import struct
from collections.abc import Mapping, Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind

_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)  # span.flags: context has is_remote, not remote
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)  # ... and is remote
_fixed64 = struct.Struct("<Q").pack
_double = struct.Struct("<d").pack
_VARINT = [bytes([i]) for i in range(128)]
_CACHE_LIMIT = 4096  # keys / resources / scopes kept encoded; beyond it they are encoded each time
_REPLACE = "otel_llm.span_encoding.replace"  # the codec error handler below: U+FFFD, counted
_replaced = [0]  # characters replaced so far, in this process (an int in a list: one writer at a time)


def _replace(error: UnicodeEncodeError) -> tuple[bytes, int]:
    _replaced[0] += error.end - error.start
    return "\ufffd".encode() * (error.end - error.start), error.end  # bytes: UTF-8 takes only ASCII str


codecs.register_error(_REPLACE, _replace)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", _REPLACE)


def replaced_characters() -> int:
    """Characters of span strings written as U+FFFD because UTF-8 cannot encode them, so far."""
    return _replaced[0]


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _VARINT[n]
    if n < 0:
        n &= (1 << 64) - 1  # int64: two's complement, ten bytes
    out = bytearray()
    while n > 127:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return tag + _varint(len(payload)) + payload


def _any_value(v) -> bytes:
    if isinstance(v, str):
        return _field(b"\x0a", v.encode("utf-8", _REPLACE))
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int):
        if not -(1 << 63) <= v < (1 << 63):
            raise TypeError(f"attribute value {v} is outside int64")
        return b"\x18" + _varint(v)
    if isinstance(v, float):
        return b"\x21" + _double(v)
    if isinstance(v, bytes):
        return _field(b"\x3a", v)
    if isinstance(v, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(x)) for x in v))
    if isinstance(v, Mapping):
        return _field(b"\x32", _attributes(b"\x0a", v))
    raise TypeError(f"cannot encode attribute value of type {type(v).__name__}")


_KEYS: dict[str, bytes] = {}


def _attributes(tag: bytes, attributes) -> bytes:
    """Repeated KeyValue field `tag` (Span.attributes is 9, Event.attributes 3, ...)."""
    if not attributes:
        return b""
    parts = []
    for key, value in getattr(attributes, "_dict", attributes).items():  # BoundedAttributes: skip its slow Mapping view
        k = _KEYS.get(key)
        if k is None:
            k = _field(b"\x0a", _utf8(key))
            if len(_KEYS) < _CACHE_LIMIT:
                _KEYS[key] = k
        if value.__class__ is str:  # the common case, inlined
            v = value.encode("utf-8", _REPLACE)
            v = b"\x0a" + _varint(len(v)) + v
        else:
            v = _any_value(value)
        kv = k + b"\x12" + _varint(len(v)) + v
        parts.append(tag + _varint(len(kv)) + kv)
    return b"".join(parts)


def _span(s) -> bytes:
    ctx, parent = s.context, s.parent
    out = [
        b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"), b"\x12\x08", ctx.span_id.to_bytes(8, "big"),
        _field(b"\x2a", _utf8(s.name)), b"\x30", _VARINT[_KIND[s.kind]],
        b"\x39", _fixed64(s.start_time or 0), b"\x41", _fixed64(s.end_time or 0),
        _attributes(b"\x4a", s.attributes),
    ]
    if ctx.trace_state:
        state = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
        out.append(_field(b"\x1a", _utf8(state)))
    if parent is not None:
        out += (b"\x22\x08", parent.span_id.to_bytes(8, "big"), _FLAGS_REMOTE if parent.is_remote else _FLAGS_LOCAL)
    else:
        out.append(_FLAGS_LOCAL)
    for e in s.events:
        out.append(_field(b"\x5a", b"\x09" + _fixed64(e.timestamp) + _field(b"\x12", _utf8(e.name))
                          + _attributes(b"\x1a", e.attributes) + _count(b"\x20", e.dropped_attributes)))
    for link in s.links:
        lc = link.context
        out.append(_field(b"\x6a", b"\x0a\x10" + lc.trace_id.to_bytes(16, "big") + b"\x12\x08"
                          + lc.span_id.to_bytes(8, "big") + _attributes(b"\x22", link.attributes)
                          + _count(b"\x28", link.dropped_attributes)
                          + b"\x35" + struct.pack("<I", 0x300 if lc.is_remote else 0x100)))
    status = s.status
    code = status.status_code.value
    out.append(_field(b"\x7a", (_field(b"\x12", _utf8(status.description)) if status.description else b"")
                      + (b"\x18" + _VARINT[code] if code else b"")))
    out += (_count(b"\x50", s.dropped_attributes), _count(b"\x60", s.dropped_events), _count(b"\x70", s.dropped_links))
    return b"".join(out)


def _count(tag: bytes, n: int) -> bytes:
    return tag + _varint(n) if n else b""


_RESOURCES: dict = {}
_SCOPES: dict = {}


def _cached(cache: dict, obj, encode) -> bytes:
    """`encode(obj)`, kept by identity (the SDK's Resource hashes by JSON-dumping its attributes)."""
    hit = cache.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    data = encode(obj)
    if len(cache) < _CACHE_LIMIT:
        cache[id(obj)] = (obj, data)
    return data


def _resource(r) -> bytes:
    body = _field(b"\x0a", _attributes(b"\x0a", r.attributes))
    return body + (_field(b"\x1a", _utf8(r.schema_url)) if r.schema_url else b"")


def _scope(scope) -> bytes:
    if scope is None:
        return b"\x0a\x00"  # an empty scope, as the SDK writes it
    body = _field(b"\x0a", _utf8(scope.name)) if scope.name else b""
    if scope.version:
        body += _field(b"\x12", _utf8(scope.version))
    body += _attributes(b"\x1a", scope.attributes)
    return _field(b"\x0a", body) + (_field(b"\x1a", _utf8(scope.schema_url)) if scope.schema_url else b"")


def encode_spans(spans: Sequence) -> bytes:
    """The serialised `ExportTraceServiceRequest` for `spans`, grouped by resource, then scope."""
    groups: dict = {}  # by identity: one provider's spans share its resource and scope objects
    for s in spans:
        resource, scope = s.resource, s.instrumentation_scope
        group = groups.setdefault((id(resource), id(scope)), (resource, scope, []))
        group[2].append(_field(b"\x12", _span(s)))
    by_resource: dict = {}
    for resource, scope, encoded in groups.values():
        scope_spans = _field(b"\x12", _cached(_SCOPES, scope, _scope) + b"".join(encoded))
        by_resource.setdefault(id(resource), (resource, []))[1].append(scope_spans)
    return b"".join(_field(b"\x0a", _cached(_RESOURCES, resource, _resource) + b"".join(scope_spans))
                    for resource, scope_spans in by_resource.values())


class FastOTLPSpanExporter(OTLPSpanExporter):
    """`OTLPSpanExporter` with `encode_spans` above. It hands the bytes to the SDK's own
    HTTP client (SDK >= 1.45 keeps one in `_client`); with an SDK laid out otherwise,
    for a batch this encoder cannot encode, or one over the request size limit, it
    is the SDK's `export`, unchanged."""

    @property
    def fast(self) -> bool:
        """Whether batches take the fast path (the installed SDK has the client it needs)."""
        return callable(getattr(getattr(self, "_client", None), "export", None))

    def export(self, spans) -> SpanExportResult:
        if self._shutdown or not self.fast:
            return super().export(spans)
        try:
            data = encode_spans(spans)
        except TypeError:
            return super().export(spans)
        if len(data) > (getattr(self, "_max_request_size", None) or float("inf")):
            return super().export(spans)  # its warning and drop
        return SpanExportResult.SUCCESS if self._client.export(data).success else SpanExportResult.FAILURE
