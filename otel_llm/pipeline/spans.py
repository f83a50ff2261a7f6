"""A pipeline request's span tree, built once when it finishes (as `tracing.RequestTracer` does).

Tree: a root `pipeline {model}` (SERVER, or INTERNAL under an incoming W3C `traceparent`) from
arrival to finish, with one child per stage visit (`stage {stage}`, attributes
`otel_llm.pipeline.stage` / `.replica`) and one per transfer hop (`transfer {from}->{to}`,
from the sender's start to the receiver's end, events `tx_done` and `rx_start`, attribute
`otel_llm.pipeline.transfer.size_bytes`). Timestamps are the ones the histograms took, on the
pipeline's monotonic clock converted to epoch ns by its (wall, monotonic) anchor, so a span's
duration is exactly the value observed. Finished spans go straight to the provider's span
processors, through the same hook as `request_spans.py` (see its module docstring).

Threads: `start` and `emit` may be called from any thread (the SDK's processors are thread-safe).
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

from otel_llm.export.otlp_traces import end_spans
from otel_llm.export.finished_spans import FinishedSpan, RecordedEvent
from otel_llm.frontend.request_spans import new_span_identity, sampled_context
from otel_llm.frontend.span_limits import SpanLimiter


class PipelineTracer:
    def __init__(self, provider: TracerProvider, model_name: str, provider_name: str, anchor: tuple[int, int]):
        self.provider = provider
        self.model_name = model_name
        self.provider_name = provider_name
        self._offset = anchor[0] - anchor[1]  # monotonic -> epoch ns
        self._processor = provider._active_span_processor  # see tracing.py
        self._limits = SpanLimiter(provider._span_limits)

    def start(self, headers: dict[str, str] | None):
        """The root span's identity: (trace id, span id, parent SpanContext or None), or None when not sampled."""
        kind = SpanKind.INTERNAL if headers else SpanKind.SERVER
        trace_id, span_id, parent, sampled = new_span_identity(self.provider, headers, f"pipeline {self.model_name}",
                                                               kind)
        return (trace_id, span_id, parent) if sampled else None

    def emit(self, req) -> None:
        """Build and export `req`'s tree (a finished `PipelineRequest`)."""
        trace_id, span_id, parent = req.identity
        reason, end = req.finished
        off, limits = self._offset, self._limits
        resource, ids = self.provider.resource, self.provider.id_generator
        root = sampled_context(trace_id, span_id)
        if parent is not None:
            parent = sampled_context(trace_id, parent.span_id, True)
        attrs = {
            "gen_ai.provider.name": self.provider_name,
            "gen_ai.request.model": self.model_name,
            "gen_ai.request.id": req.request_id,
            "gen_ai.response.finish_reasons": (reason,),
            "gen_ai.latency.e2e": (end - req.arrival_ns) * 1e-9,
        }
        status = Status(StatusCode.UNSET)
        if reason in ("abort", "error"):
            attrs["error.type"] = req.failure or reason
            status = Status(StatusCode.ERROR, f"request finished with {reason}")
        spans = [FinishedSpan(f"pipeline {self.model_name}", root, parent, resource, limits.attributes(attrs),
                              req.arrival_ns + off, end + off, (), SpanKind.INTERNAL if parent else SpanKind.SERVER,
                              status)]

        def child(name, start, stop, attributes, events=()):
            ctx = sampled_context(trace_id, ids.generate_span_id())
            spans.append(FinishedSpan(name, ctx, root, resource, limits.attributes(attributes), start + off, stop + off,
                                      limits.events(events)))

        for v in req.visits:
            child(f"stage {v.stage}", v.start_ns, v.end_ns,
                  {"otel_llm.pipeline.stage": v.stage, "otel_llm.pipeline.replica": v.replica})
        for h in req.hops:
            child(f"transfer {h.from_stage}->{h.to_stage}", h.tx_start_ns, h.rx_end_ns,
                  {"otel_llm.pipeline.from_stage": h.from_stage, "otel_llm.pipeline.from_replica": h.from_replica,
                   "otel_llm.pipeline.to_stage": h.to_stage, "otel_llm.pipeline.to_replica": h.to_replica,
                   "otel_llm.pipeline.transfer.size_bytes": h.size_bytes},
                  (RecordedEvent("tx_done", h.tx_end_ns + off), RecordedEvent("rx_start", h.rx_start_ns + off)))
        end_spans(self._processor, spans[::-1])  # children first, like live spans ending
