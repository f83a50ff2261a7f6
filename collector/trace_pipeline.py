"""The collector's traces pipeline: each received ExportTraceServiceRequest, checked once, given
phase spans where an engine's request span only reports latencies (vLLM's `llm_request`, see
`phase_spans`; on unless turned off), through the tail sampler when it is on, to every trace
backend's exporter and the trace store.

Without sampling a request is parsed in full once (so a malformed one answers 400 /
INVALID_ARGUMENT at the receiver instead of failing at a backend later, merged with good ones),
its spans counted, and the exporters get the bytes as they came. With sampling it is parsed
into its resources, scopes and spans (each checked), which wait in the `TailSampler`; the
spans of kept traces go out as new requests. Either way a span whose ids break OTLP's rules
(`span_ids`: a 3-byte trace_id, an empty span_id) is refused and the request's other spans are
taken: the receiver answers an OTLP partial success (rejected_spans, error_message), and no
backend or store batch ever holds a span that would make it refuse the whole batch.

Thread-safety: `consume` runs on the receivers' request threads, `tick` on the housekeeping
thread; exporters' `export` is thread-safe and never blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.canonical.instruments import Kind
from otel_llm.collector.exporter.otlp import OtlpExporter
from otel_llm.collector.exporter.prometheus.exposition import SelfFamily
from otel_llm.collector.exporter.trace_store import TraceStoreWriter
from otel_llm.collector.pdata.otlp_codec import PayloadError
from otel_llm.collector.pdata.span_ids import id_problem, ids_valid
from otel_llm.collector.pdata.traces_wire import TracesRequest
from otel_llm.collector.processor.phase_spans import PhaseSpans
from otel_llm.collector.processor.tail_sampling import TailSampler, TailSamplingConfig
from otel_llm.export.exposition import label_text


class TracesTaken(NamedTuple):
    """What `TracePipeline.consume` did with one request."""

    accepted: int  # spans taken on, the derived phase spans included
    refused: int  # spans refused for their ids
    reason: str  # "" when none was refused; else each distinct problem with its count, "; "-joined


class TracePipeline:
    def __init__(self, exporters: Sequence[OtlpExporter | TraceStoreWriter],
                 sampling: TailSamplingConfig | None = None, phase_spans: bool = True) -> None:
        self.exporters = tuple(exporters)
        self.sampler = None if sampling is None else TailSampler(sampling, self._export)
        self.phase_spans = PhaseSpans() if phase_spans else None

    def consume(self, payload: bytes) -> TracesTaken:
        """Take one request, less its spans with invalid ids (refused and counted in the result).
        Raises PayloadError(400) when it is not an ExportTraceServiceRequest."""
        refused: dict[str, int] = {}
        try:
            if self.phase_spans is not None:
                payload = self.phase_spans.process(payload)  # derives only from spans with valid ids
            if self.sampler is None:
                request = ExportTraceServiceRequest.FromString(payload)
                spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                if not ids_valid(payload):  # rare: send on the rest
                    payload = _without_invalid(payload, refused)
                    spans -= sum(refused.values())
                self._export(payload, spans)
                return _taken(spans, refused)
            check = not ids_valid(payload)  # a malformed payload raises DecodeError here or below
            parsed = []
            for rs in TracesRequest.FromString(payload).resource_spans:
                Resource.FromString(rs.resource)
                for ss in rs.scope_spans:
                    InstrumentationScope.FromString(ss.scope)
                    decoded = [Span.FromString(raw) for raw in ss.spans]
                    bad = _invalid(decoded, refused) if check else set()
                    parsed += ((rs.resource, ss.scope, span, raw) for i, (span, raw) in enumerate(zip(decoded, ss.spans))
                               if i not in bad)
        except (DecodeError, RecursionError) as exc:
            raise PayloadError(400, f"malformed protobuf ExportTraceServiceRequest: {exc}") from None
        self.sampler.consume(parsed)
        return _taken(len(parsed), refused)

    def tick(self) -> None:
        if self.sampler is not None:
            self.sampler.tick()

    def flush(self) -> None:
        if self.sampler is not None:
            self.sampler.flush()

    def _export(self, payload: bytes, spans: int) -> None:
        if spans:
            for exporter in self.exporters:
                exporter.export(payload, spans)

    def families(self) -> list[SelfFamily]:
        """The phase spans' and the tail sampler's counters, for the collector's own /metrics."""
        out = []
        if self.phase_spans is not None:
            ps = self.phase_spans
            out.append(SelfFamily(
                "otel_llm_phase_spans_requests", Kind.COUNTER,
                "Latency-only request spans (vLLM's llm_request) given derived queue/prefill/decode spans, or "
                "skipped because their latencies were missing or unusable.",
                tuple((label_text((("outcome", o),)), n) for o, n in (("derived", ps.derived), ("skipped", ps.skipped)))))
        if self.sampler is None:
            return out
        stats = self.sampler.stats()
        return out + [
            SelfFamily("otel_llm_tail_sampling_traces", Kind.COUNTER, "Traces decided, by decision and reason.",
                       tuple((label_text((("decision", d), ("reason", r))), n) for (d, r), n in sorted(stats.traces.items()))),
            SelfFamily("otel_llm_tail_sampling_spans", Kind.COUNTER, "Spans kept or dropped (late ones included).",
                       tuple((label_text((("decision", d),)), n) for d, n in sorted(stats.spans.items()))),
            SelfFamily("otel_llm_tail_sampling_pending_traces", Kind.GAUGE, "Traces waiting for a decision.",
                       (("", stats.pending_traces),)),
            SelfFamily("otel_llm_tail_sampling_pending_spans", Kind.GAUGE, "Spans waiting for a decision.",
                       (("", stats.pending_spans),)),
        ]


def _invalid(spans, refused: dict[str, int]) -> set[int]:
    """Indexes of the spans whose ids break OTLP's rules, each counted in ``refused`` by its problem."""
    bad = set()
    for i, span in enumerate(spans):
        problem = id_problem(span)
        if problem:
            bad.add(i)
            refused[problem] = refused.get(problem, 0) + 1
    return bad


def _without_invalid(payload: bytes, refused: dict[str, int]) -> bytes:
    """``payload`` less its spans with invalid ids, the others as they came (a scope's kept spans
    are copied once, so any number of bad ones costs linear time)."""
    request = TracesRequest.FromString(payload)
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            raws = list(ss.spans)
            bad = _invalid([Span.FromString(raw) for raw in raws], refused)
            if bad:
                del ss.spans[:]
                ss.spans.extend(raw for i, raw in enumerate(raws) if i not in bad)
    return request.SerializeToString()


def _taken(accepted: int, refused: dict[str, int]) -> TracesTaken:
    reason = "; ".join(f"{problem} ({n} span{'s' if n > 1 else ''})" for problem, n in refused.items())
    return TracesTaken(accepted, sum(refused.values()), reason)
