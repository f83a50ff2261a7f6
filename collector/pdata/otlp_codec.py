"""OTLP/HTTP payloads: content types, decompression, decoding, responses.

Pure functions over bytes; no I/O, no state, safe from any thread. Bad input
raises PayloadError carrying the HTTP status and a reason for the client.
"""

import base64
import json
import zlib

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
CONTENT_TYPES = (PROTOBUF, JSON)

# OTLP JSON writes these ids as hex; protobuf's JSON mapping expects base64. Their lengths are
# left to the signal to judge, as over protobuf: a span with a 3-byte trace id is refused alone
# (a partial success), not the whole request.
_HEX_IDS = frozenset(("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"))
_GRPC_CODE = {400: 3, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 500: 13}


class PayloadError(Exception):
    """The request cannot be accepted; ``status`` is the HTTP answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def media_type(content_type_header: str) -> str:
    """``"application/json; charset=utf-8"`` -> ``"application/json"``."""
    return content_type_header.split(";", 1)[0].strip().lower()


def decompress(raw: bytes, content_encoding: str, limit_bytes: int) -> bytes:
    """Undo ``Content-Encoding`` (identity, gzip, deflate); at most ``limit_bytes`` out."""
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding in ("gzip", "x-gzip"):
        wbits_options = [16 + zlib.MAX_WBITS]
    elif encoding == "deflate":
        wbits_options = [zlib.MAX_WBITS, -zlib.MAX_WBITS]  # zlib-wrapped, or raw as some send
    else:
        raise PayloadError(
            415, f"unsupported Content-Encoding {content_encoding!r}; use gzip or deflate"
        )
    error = None
    for wbits in wbits_options:
        decompressor = zlib.decompressobj(wbits)
        try:
            # Bounded output: a small bomb must not expand past the limit in memory.
            data = decompressor.decompress(raw, limit_bytes + 1)
        except zlib.error as exc:
            error = exc
            continue
        if len(data) > limit_bytes:
            raise PayloadError(413, f"decompressed body exceeds the limit of {limit_bytes} bytes")
        if not decompressor.eof:
            raise PayloadError(400, f"truncated {encoding} body")
        return data
    raise PayloadError(400, f"invalid {encoding} body: {error}")


def decode(payload: bytes, content_type: str, request_type: type[Message]) -> Message:
    """Parse an Export*ServiceRequest from protobuf or OTLP JSON bytes.

    JSON fields unknown to this proto version are ignored, as the OTLP spec asks.
    """
    request = request_type()
    if content_type == PROTOBUF:
        try:
            request.ParseFromString(payload)
        except (DecodeError, RecursionError) as exc:
            raise PayloadError(400, f"malformed protobuf {request_type.__name__}: {exc}") from None
        return request
    try:
        document = json.loads(payload)
        if not isinstance(document, dict):
            raise ValueError(f"top level is {type(document).__name__}, not an object")
        _hex_ids_to_base64(document)
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (ValueError, RecursionError, json_format.ParseError) as exc:
        raise PayloadError(400, f"malformed OTLP JSON {request_type.__name__}: {exc}") from None
    return request


def encode(message: Message, content_type: str) -> bytes:
    """Serialize a response in the request's encoding."""
    if content_type == JSON:
        return json_format.MessageToJson(message, indent=None).encode()
    return message.SerializeToString()


def error_body(status: int, reason: str, content_type: str) -> bytes:
    """A ``google.rpc.Status`` in the request's encoding; plain text if that is unknown."""
    if content_type not in CONTENT_TYPES:
        return (reason + "\n").encode()
    return encode(status_pb2.Status(code=_GRPC_CODE.get(status, 2), message=reason), content_type)


def _hex_ids_to_base64(node: object) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _HEX_IDS and isinstance(value, str):
                node[key] = _hex_id(key, value)
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)


def _hex_id(key: str, value: str) -> str:
    if value == "":
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"{key} {value[:40]!r} is not hex") from None
    return base64.b64encode(raw).decode()
