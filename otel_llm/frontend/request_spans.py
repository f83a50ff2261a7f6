"""Retroactive gen_ai span trees, built once per request when it finishes.

At arrival we only decide the trace identity: the parent from an incoming W3C
`traceparent` (if any), a trace id, and the sampling decision of the provider's
sampler. When the request finishes, its whole tree is built from the recorded
timestamps as SDK `ReadableSpan`s and handed straight to the provider's span
processors (`on_end`), skipping the live-span machinery (`start_span`/`end`
costs ~5x more, see shared/reference/measured-here.md). That hand-off uses the
SDK's `TracerProvider._active_span_processor`: the smallest hook that lets a
finished span enter the normal export pipeline (BatchSpanProcessor, OTLP).

Tree: `{operation} {model}` (SERVER when it has no parent, INTERNAL under an
HTTP server span), from arrival to the last output on this frontend's clock, with
children `queue`, `prefill`, `decode` on the engine's; events `first_token` (when
the frontend had it: start + `gen_ai.latency.time_to_first_token`, exactly; the
prefill span ends when the engine made it, the gap is the hand-off) and one
`preempted` per preemption. With the engine lane, the request span also says what its steps were
(`otel_llm.engine.steps`, `.max_batch_requests`, `.interfering_prefill_tokens`, and vLLM's
`gen_ai.latency.time_in_model_forward` where the forward pass was measured). Every time goes through one anchor
(`otel_llm.engine.clock`), so no child starts before its parent. The provider's span limits
apply (`otel_llm.frontend.span_limits`), with string values cut at 4096 characters by default.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random

import numpy as np

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, StaticSampler
from opentelemetry.trace import DEFAULT_TRACE_STATE, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status, StatusCode

from otel_llm.canonical.instruments import ADAPTER_ATTRIBUTE
from otel_llm.engine.clock import offset_for
from otel_llm.engine.step import FinishReason
from otel_llm.frontend.request import RequestInfo
from otel_llm.export.finished_spans import (SCOPE as _SCOPE, UNSET as _UNSET, FinishedSpan, RecordedEvent,
                                            child_span_class)
from otel_llm.export.lane_spans import LANE_SPAN, lane_attributes
from otel_llm.export.otlp_traces import end_spans
from otel_llm.frontend.request_table import FinishedBatch
from otel_llm.frontend.span_limits import SpanLimiter

_PROPAGATOR = TraceContextTextMapPropagator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_MASK64 = (1 << 64) - 1
_getrandbits = random.getrandbits  # what the SDK's RandomIdGenerator draws from
_new_tuple = tuple.__new__
_REASONS = {int(r): r for r in FinishReason}
_REASON_LABELS = {r: (r.label,) for r in FinishReason}  # shared tuples of str: the attributes stay untracked by gc
_FAILED = (FinishReason.ABORT, FinishReason.ERROR)
_SUMMARY_KEYS = ("covered", "steps", "max_batch", "interfering_prefill_tokens", "forward_ns")  # `EngineLane.summaries`
_COLUMNS = ("reason", "arrival", "finish_recv", "queued", "sched", "first", "last", "first_recv", "num_prompt",
            "num_gen", "num_cached", "npre", "engine_valid")  # a FinishedBatch's, read per request


def capture_content_from_env() -> bool:
    """OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: SPAN_ONLY / SPAN_AND_EVENT / true opt in."""
    v = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower()
    return v in ("true", "span_only", "span_and_event")


def sampled_context(trace_id: int, span_id: int, remote: bool = False) -> SpanContext:
    """A sampled `SpanContext` of ids known valid (from the provider's generator or a parsed
    `traceparent`): SpanContext's own tuple, without its range checks per span (a test holds the
    two equal)."""
    return tuple.__new__(SpanContext, (trace_id, span_id, remote, _SAMPLED, DEFAULT_TRACE_STATE, True))


def _one_draw(ids) -> tuple[int, int, int] | None:
    """Three 64-bit words from one 192-bit draw where `ids` is the SDK's RandomIdGenerator (the source it
    draws each id from; a third of the calls), else None: the generator makes each id itself."""
    if type(ids) is not RandomIdGenerator:
        return None
    bits = _getrandbits(192)
    return bits >> 128, (bits >> 64) & _MASK64, bits & _MASK64


def _three_ids(ids) -> tuple[int, int, int]:
    """Three span ids as `ids.generate_span_id()` would give them (an id of 0, invalid, drawn again its way)."""
    words = _one_draw(ids)
    if words is not None and all(words):
        return words
    return ids.generate_span_id(), ids.generate_span_id(), ids.generate_span_id()


def _fixed_root_decision(sampler) -> bool | None:
    """Whether `sampler` samples every new root span (ALWAYS_ON / ALWAYS_OFF, alone or as the root of
    ParentBased, the SDK's default), or None when that depends on the span (a ratio, a custom sampler)."""
    return _fixed_decision(sampler) if type(sampler) in (ParentBased, StaticSampler) else None


@functools.lru_cache(maxsize=32)
def _fixed_decision(sampler: ParentBased | StaticSampler) -> bool | None:
    if type(sampler) is StaticSampler:
        return sampler.should_sample(None, 1, "").decision.is_sampled()
    description = sampler.get_description()
    for fixed, sampled in (("AlwaysOnSampler", True), ("AlwaysOffSampler", False)):
        if description.startswith(f"ParentBased{{root:{fixed},"):
            return sampled
    return None


def new_span_identity(provider: TracerProvider, headers: dict[str, str] | None, name: str,
                      kind: SpanKind) -> tuple[int, int, SpanContext | None, bool]:
    """(trace id, span id, parent, sampled) of a new span: a child of `headers`' W3C
    `traceparent` when it has a valid one, else a new trace's root; sampled as the
    provider's sampler decides (ParentBased by default: as the parent was)."""
    parent_ctx = _PROPAGATOR.extract(headers) if headers else None
    parent = trace_api.get_current_span(parent_ctx).get_span_context() if parent_ctx else None
    if parent is not None and not parent.is_valid:
        parent = None
    ids = provider.id_generator
    if parent is None and (fixed := _fixed_root_decision(provider.sampler)) is not None:
        return ids.generate_trace_id(), ids.generate_span_id(), None, fixed  # a root: no sampler call per span
    trace_id = parent.trace_id if parent else ids.generate_trace_id()
    decision = provider.sampler.should_sample(parent_ctx, trace_id, name, kind)
    return trace_id, ids.generate_span_id(), parent, decision.decision.is_sampled()


class RequestTracer:
    """Samples at arrival, builds and emits the span tree at finish. Frontend thread only."""

    def __init__(self, provider: TracerProvider, model_name: str, provider_name: str, capture_content: bool,
                 frontend_anchor: tuple[int, int]):
        self.provider = provider
        self.model_name = model_name
        self.provider_name = provider_name
        self.capture_content = capture_content
        self.wall0, self.mono0 = frontend_anchor
        self._processor = provider._active_span_processor  # see module docstring
        self._resource = provider.resource
        self._limits = SpanLimiter(provider._span_limits)  # the SDK applies them to live spans only
        self._child_attrs: dict[str, dict] = {}  # operation -> the child spans' attributes
        self._root_sampled = _fixed_root_decision(provider.sampler)  # (a provider's sampler is read-only)
        self._child_span = child_span_class(self._resource)  # queue, prefill, decode
        fixed = self._limits.attributes({"gen_ai.provider.name": provider_name, "gen_ai.request.model": model_name})
        self._provider_attr, self._model_attr = fixed.values()  # bounded once

    def start(self, info: RequestInfo, operation: str) -> tuple[int, int, int, int]:
        """Trace identity for a new request: (trace_hi, trace_lo, span_id or 0, parent span_id or 0)."""
        if not info.trace_headers and self._root_sampled is not None:  # a root, sampled or not whatever it is
            ids = self.provider.id_generator
            words = _one_draw(ids)  # the trace id and span id
            if words is not None and (words[0] or words[1]) and words[2]:
                return words[0], words[1], words[2] if self._root_sampled else 0, 0
            trace_id = ids.generate_trace_id()
            return trace_id >> 64, trace_id & _MASK64, ids.generate_span_id() if self._root_sampled else 0, 0
        trace_id, span_id, parent, sampled = new_span_identity(
            self.provider, info.trace_headers, f"{operation} {self.model_name}",
            SpanKind.INTERNAL if info.trace_headers else SpanKind.SERVER)
        return trace_id >> 64, trace_id & _MASK64, span_id if sampled else 0, parent.span_id if parent else 0

    def emit(self, b: FinishedBatch, engine_anchor: tuple[int, int], steps: dict | None = None) -> int:
        """Build and export the trees of the sampled requests in `b`; returns how many. `steps`: their
        engine-lane summaries (`EngineLane.summaries`), shown on the request span where covered."""
        f_off = self.wall0 - self.mono0  # frontend mono -> epoch
        e_off = offset_for(*engine_anchor, f_off)  # engine mono -> epoch: the same when on this host's clock
        sampled = [i for i, span_id in enumerate(b.trace[:, 2].tolist()) if span_id]
        if not sampled:
            return 0
        traces = b.trace[sampled].tolist()
        rows = zip(*(getattr(b, c)[sampled].tolist() for c in _COLUMNS))  # Python ints: no numpy scalar per field
        summaries = (zip(*(np.asarray(steps[k])[sampled].tolist() for k in _SUMMARY_KEYS)) if steps is not None
                     else itertools.repeat(None))
        spans = []
        for i, (hi, lo, span_id, parent_id), row, summary in zip(sampled, traces, rows, summaries):
            self._emit_one(b, i, row, (hi << 64) | lo, span_id, parent_id, e_off, f_off, summary, spans)
        end_spans(self._processor, spans)
        return len(sampled)

    def emit_lane(self, cols: dict, engine_anchor: tuple[int, int], engine: str) -> None:
        """One `engine steps` span, a trace of its own, for the steps in `cols` (`EngineLane.columns`):
        from the first one's start to the last one's end, each step's figures in array attributes
        (`lane_spans.lane_attributes`). Always exported: a tail sampler keeps it with the request
        traces it overlaps."""
        e_off = offset_for(*engine_anchor, self.wall0 - self.mono0)
        start = int(cols["start_ns"][0])
        ids = self.provider.id_generator
        ctx = SpanContext(ids.generate_trace_id(), ids.generate_span_id(), False, _SAMPLED)
        attrs = {"gen_ai.request.model": self.model_name, "otel_llm.engine": engine, **lane_attributes(cols, start)}
        self._processor.on_end(ReadableSpan(LANE_SPAN, ctx, None, self._resource, attrs, (), (), SpanKind.INTERNAL,
                                            None, Status(StatusCode.UNSET), start + e_off,
                                            int(cols["end_ns"][-1]) + e_off, _SCOPE))

    def _emit_one(self, b: FinishedBatch, i: int, row: tuple, trace_id: int, span_id: int, parent_id: int,
                  e_off: int, f_off: int, summary: tuple | None, out: list) -> None:
        """Request `i` of `b`, whose `_COLUMNS` values are `row` (and `_SUMMARY_KEYS` values, where the
        lane summarised it, `summary`): its spans onto `out`, children first (like live spans ending)."""
        reason, arrival, finish_recv, q, s, f, last, first_recv, num_prompt, num_gen, num_cached, npre, valid = row
        info = b.infos[i]
        reason = _REASONS[reason]
        op = info.operation
        ctx = _new_tuple(SpanContext, (trace_id, span_id, False, _SAMPLED, DEFAULT_TRACE_STATE, True))  # (sampled_)
        parent = sampled_context(trace_id, parent_id, True) if parent_id else None
        start, end = arrival + f_off, finish_recv + f_off
        model = self._model_attr
        attrs = {
            "gen_ai.operation.name": op,
            "gen_ai.provider.name": self._provider_attr,
            "gen_ai.request.model": model,
            "gen_ai.response.model": model,
            "gen_ai.request.id": info.request_id,
            "gen_ai.response.id": info.request_id,
            "gen_ai.response.finish_reasons": _REASON_LABELS[reason],
            "gen_ai.usage.input_tokens": num_prompt,
            "gen_ai.usage.output_tokens": num_gen,
            "gen_ai.usage.cache_read.input_tokens": num_cached,
            "gen_ai.latency.e2e": (finish_recv - arrival) * 1e-9,
            "otel_llm.num_preemptions": npre,
        }
        if info.max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = info.max_tokens
        if info.temperature is not None:
            attrs["gen_ai.request.temperature"] = info.temperature
        if info.top_p is not None:
            attrs["gen_ai.request.top_p"] = info.top_p
        if info.top_k is not None:
            attrs["gen_ai.request.top_k"] = info.top_k
        if info.seed is not None:
            attrs["gen_ai.request.seed"] = info.seed
        if info.n != 1:
            attrs["gen_ai.request.choice.count"] = info.n
        if info.stream:
            attrs["gen_ai.request.stream"] = True
        strings = [op, info.request_id]  # the values that may be too long: all but the fixed ones
        if info.lora_name:
            attrs[ADAPTER_ATTRIBUTE] = lora = str(info.lora_name)
            strings.append(lora)
        if info.stop_sequences:
            attrs["gen_ai.request.stop_sequences"] = tuple(info.stop_sequences)
            strings = None  # check every value
        events = []
        if first_recv:  # the event where TTFT puts it: when this frontend had the first token
            attrs["gen_ai.latency.time_to_first_token"] = (first_recv - arrival) * 1e-9
            events.append(RecordedEvent("first_token", first_recv + f_off))
        if valid:
            attrs["gen_ai.latency.time_in_queue"] = (s - q) * 1e-9
            attrs["gen_ai.latency.time_in_model_prefill"] = (f - s) * 1e-9
            attrs["gen_ai.latency.time_in_model_decode"] = (last - f) * 1e-9
            attrs["gen_ai.latency.time_in_model_inference"] = (last - s) * 1e-9
        if summary is not None and summary[0]:  # the window held its first step
            _, attrs["otel_llm.engine.steps"], attrs["otel_llm.engine.max_batch_requests"], \
                attrs["otel_llm.engine.interfering_prefill_tokens"], forward_ns = summary
            if forward_ns:
                attrs["gen_ai.latency.time_in_model_forward"] = forward_ns * 1e-9

        if b.preemption_ts[i]:
            events.extend(RecordedEvent("preempted", t + e_off) for t in b.preemption_ts[i])
        if self.capture_content:
            strings = None
            if info.input_messages is not None:
                attrs["gen_ai.input.messages"] = info.input_messages
            if b.outputs[i] is not None:  # one text per choice (n > 1 sequences)
                attrs["gen_ai.output.messages"] = json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": reason.label}
                     for text in b.outputs[i]])
        status = _UNSET
        if reason in _FAILED:
            attrs["error.type"] = reason.label
            status = Status(StatusCode.ERROR, f"request finished with {reason.label}")
        kind = SpanKind.INTERNAL if parent else SpanKind.SERVER
        limits = self._limits
        attrs = limits.attributes(attrs, strings)
        root = FinishedSpan(f"{op} {self.model_name}", ctx, parent, self._resource, attrs, start, end,
                            limits.events(events), kind, status)
        if valid:  # children last to first, as live spans would end (sampled_context spelt out: 3 calls fewer)
            child_attrs = self._child_attrs.get(op)  # shared: spans are read-only
            if child_attrs is None:
                child_attrs = self._child_attrs[op] = limits.attributes({"gen_ai.operation.name": op})
            qid, pid, did = _three_ids(self.provider.id_generator)  # the queue's, prefill's and decode's
            child, q, s, f, last = self._child_span, q + e_off, s + e_off, f + e_off, last + e_off
            new, sampled, state = _new_tuple, _SAMPLED, DEFAULT_TRACE_STATE
            out += (child("decode", new(SpanContext, (trace_id, did, False, sampled, state, True)), ctx, child_attrs,
                          f, last),
                    child("prefill", new(SpanContext, (trace_id, pid, False, sampled, state, True)), ctx, child_attrs,
                          s, f),
                    child("queue", new(SpanContext, (trace_id, qid, False, sampled, state, True)), ctx, child_attrs,
                          q, s))
        out.append(root)
