"""Phase spans for engines whose request span only reports latencies.

vLLM exports one `llm_request` span per request, its phases only as `gen_ai.latency.*`
attributes (seconds): no children, no events. `PhaseSpans` gives such a span the children
otel-llm's own request spans have: `queue`, `prefill` and `decode` (INTERNAL, marked
`otel_llm.derived`), and a `first_token` event on `prefill`, so the trace store, the Jaeger API
and tail sampling treat a vLLM request like one of ours. The original spans pass through
byte for byte; the derived ones go in a scope of their own (`otel_llm.collector.phase_spans`)
beside them, under the same resource.

Anchoring (vLLM's durations come from two clocks):
- exact: the first token at span start + `time_to_first_token` (both on the API server's wall
  clock, as vLLM's TTFT histogram), and every phase's duration (the attribute, to the ns);
- inferred: `prefill` ends at the first token and `queue` ends where `prefill` starts (the engine's
  monotonic clock, so those two boundaries are exact relative to each other); `decode` starts at the
  first token. The engine saw the first token earlier than the API server did (output transfer and
  detokenisation, typically well under a millisecond), so the engine phases are placed that much
  late; the gap from span start to `queue` start is the API server's own time before the engine
  queued the request (tokenisation, transfer), which vLLM does not report. `decode`'s end and the
  span's end differ by how much the last token's transfer differed from the first one's.

Span ids are derived from the request span's ids, so a retried export or a second collector
derives the same ones. A dialect is one table entry: another engine's latency span is one more.
"""

from __future__ import annotations

import hashlib
import math
import threading
from typing import NamedTuple

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.collector.pdata.span_ids import id_problem
from otel_llm.collector.pdata.traces_wire import TracesRequest


class LatencyDialect(NamedTuple):
    """How one engine's request span reports its phases: its scope and name, and the attributes
    (seconds) of time to first token (from the span's start), queue, prefill and decode."""

    scope: str
    span_name: str
    first_token: str
    queue: str
    prefill: str
    decode: str


VLLM = LatencyDialect("vllm.tracing.otel", "llm_request", "gen_ai.latency.time_to_first_token",
                      "gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_model_prefill",
                      "gen_ai.latency.time_in_model_decode")
DIALECTS = (VLLM,)
SCOPE = InstrumentationScope(name="otel_llm.collector.phase_spans", version="0.1.0")
_SCOPE_BYTES = SCOPE.SerializeToString()
_DERIVED = KeyValue(key="otel_llm.derived", value=AnyValue(bool_value=True))


class PhaseSpans:
    """Thread-safe: `process` runs on the receivers' request threads."""

    def __init__(self, dialects: tuple[LatencyDialect, ...] = DIALECTS) -> None:
        self._by_scope = {d.scope: d for d in dialects}
        self._needles = tuple(d.scope.encode() for d in dialects)
        self._lock = threading.Lock()
        self.derived = 0  # request spans given phase spans
        self.skipped = 0  # request spans of a known dialect whose latencies were missing or unusable

    def process(self, payload: bytes) -> bytes:
        """An ExportTraceServiceRequest with the derived spans added (the same bytes when there are
        none). Raises DecodeError on a malformed request that names a known scope."""
        if not any(needle in payload for needle in self._needles):  # the common case: no parse at all
            return payload
        request = TracesRequest.FromString(payload)
        derived = skipped = 0
        for rs in request.resource_spans:
            new: list[bytes] = []
            for ss in rs.scope_spans:
                dialect = self._by_scope.get(InstrumentationScope.FromString(ss.scope).name)
                if dialect is None:
                    continue
                for raw in ss.spans:
                    span = Span.FromString(raw)
                    if span.name != dialect.span_name:
                        continue
                    phases = derive(span, dialect)
                    if phases:
                        new += (p.SerializeToString() for p in phases)
                        derived += 1
                    else:
                        skipped += 1
            if new:
                rs.scope_spans.add(scope=_SCOPE_BYTES, spans=new)
        with self._lock:
            self.derived += derived
            self.skipped += skipped
        return request.SerializeToString() if derived else payload


def derive(span: Span, dialect: LatencyDialect) -> list[Span]:
    """`queue`, `prefill` (with the `first_token` event) and `decode` under `span`; [] when any of
    the four latencies is missing, negative or not finite, or the span has no valid ids."""
    wanted = (dialect.first_token, dialect.queue, dialect.prefill, dialect.decode)
    seconds: dict[str, float] = {}
    for kv in span.attributes:
        if kv.key in wanted:
            kind = kv.value.WhichOneof("value")
            if kind == "double_value":
                seconds[kv.key] = kv.value.double_value
            elif kind == "int_value":
                seconds[kv.key] = float(kv.value.int_value)
    values = [seconds.get(key) for key in wanted]
    if any(v is None or not math.isfinite(v) or v < 0 for v in values) or id_problem(span):
        return []  # a span with bad ids is refused by the pipeline: no children of it
    ttft, queue, prefill, decode = (round(v * 1e9) for v in values)
    first = span.start_time_unix_nano + ttft
    prefill_start = first - prefill
    if prefill_start - queue < 0 or first + decode >= 1 << 64:
        return []
    out = []
    for name, start, end, key in (("queue", prefill_start - queue, prefill_start, dialect.queue),
                                  ("prefill", prefill_start, first, dialect.prefill),
                                  ("decode", first, first + decode, dialect.decode)):
        child = Span(trace_id=span.trace_id, span_id=_span_id(span, name), parent_span_id=span.span_id,
                     name=name, kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=start,
                     end_time_unix_nano=end, flags=span.flags & 0xFF)  # W3C trace flags; a local parent
        child.attributes.append(_DERIVED)
        child.attributes.add(key="otel_llm.derived_from", value=AnyValue(string_value=key))
        out.append(child)
    out[1].events.add(name="first_token", time_unix_nano=first)
    return out


def _span_id(span: Span, name: str) -> bytes:
    digest = hashlib.blake2b(span.trace_id + span.span_id + name.encode(), digest_size=8).digest()
    return digest if any(digest) else b"\x00" * 7 + b"\x01"
