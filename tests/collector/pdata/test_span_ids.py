"""The OTLP span id rules: each problem named, and the whole-request proof (`ids_valid`) agreeing
with the per-span check on every request, hand-built and random, including encodings no SDK writes
(fields out of order, a field repeated so its last value wins, unknown fields, a wrong wire type)."""

from __future__ import annotations

import random

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.collector.pdata.span_ids import id_problem, ids_valid

TRACE, SPAN, PARENT = bytes(range(1, 17)), bytes(range(1, 9)), bytes(range(9, 17))


def request_of(*scopes: list[bytes]) -> bytes:
    """A request with one scope per argument, each span given as its serialized bytes."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "svc"
    for spans in scopes:
        ss = rs.scope_spans.add()
        ss.scope.name = "s"
        for raw in spans:
            ss.spans.add().MergeFromString(raw)
    return request.SerializeToString()


def varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
    return out + bytes([n])


def field(number: int, value: bytes) -> bytes:
    """A length-delimited field, as protobuf writes one."""
    return varint(number << 3 | 2) + varint(len(value)) + value


def span(trace_id=TRACE, span_id=SPAN, parent=b"", **fields) -> bytes:
    return Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name="op", kind=2,
                start_time_unix_nano=1, end_time_unix_nano=2, **fields).SerializeToString()


@pytest.mark.parametrize(("ids", "problem"), [
    ({}, ""),
    ({"parent": PARENT}, ""),
    ({"trace_id": b"\x01\x02\x03"}, "trace_id is 3 bytes, not 16"),
    ({"trace_id": b""}, "trace_id is 0 bytes, not 16"),
    ({"trace_id": bytes(16)}, "trace_id is all zero"),
    ({"span_id": b""}, "span_id is 0 bytes, not 8"),
    ({"span_id": bytes(8)}, "span_id is all zero"),
    ({"span_id": bytes(16)}, "span_id is 16 bytes, not 8"),
    ({"parent": b"\x01" * 5}, "parent_span_id is 5 bytes, not 0 or 8"),
])
def test_each_problem_is_named_and_the_request_proof_agrees(ids, problem):
    raw = span(**ids)
    assert id_problem(Span.FromString(raw)) == problem
    assert ids_valid(request_of([span(), raw, span(parent=PARENT)])) is (problem == "")


def test_encodings_no_sdk_writes_are_judged_by_what_they_parse_to():
    reordered = field(4, PARENT) + field(5, b"op") + field(2, SPAN) + field(1, TRACE)
    overridden = span() + field(1, b"\x01\x02\x03")  # a later trace_id wins: 3 bytes
    overridden_back = field(1, b"\x01\x02\x03") + span()  # ...and here the valid one wins
    unknown = span() + field(99, b"future") + varint(100 << 3) + varint(7)  # a length-delimited and a varint field
    wrong_wire_type = varint(1 << 3) + varint(5) + span()[18:]  # trace_id as a varint: unknown, so it is empty
    embedded = span(trace_id=b"\x12\x1c\x0a\x10" + TRACE + b"\x12\x08" + SPAN)  # a valid record inside a bad id
    for raw, valid in ((reordered, True), (overridden, False), (overridden_back, True), (unknown, True),
                       (wrong_wire_type, False), (embedded, False)):
        assert (id_problem(Span.FromString(raw)) == "") is valid
        assert ids_valid(request_of([raw])) is valid
        assert ids_valid(request_of([span()], [span(), raw])) is valid


def test_the_request_proof_agrees_with_the_per_span_check_on_random_requests():
    rng = random.Random(7)

    def random_id(size: int) -> bytes:
        choice = rng.random()
        if choice < 0.7:
            return rng.randbytes(size)
        if choice < 0.8:
            return bytes(size)
        return rng.randbytes(rng.choice([0, 1, 3, 7, 9, 15, 17, 32]))

    for _ in range(2000):
        scopes = [[span(random_id(16), random_id(8), rng.choice([b"", b"", random_id(8)]),
                        trace_state=rng.choice(["", "k=v"]))
                   for _ in range(rng.randint(0, 4))] for _ in range(rng.randint(0, 3))]
        payload = request_of(*scopes)
        spans = [s for rs in ExportTraceServiceRequest.FromString(payload).resource_spans
                 for ss in rs.scope_spans for s in ss.spans]
        assert ids_valid(payload) is all(id_problem(s) == "" for s in spans)
