"""Span trees: shape, attributes, timestamps consistent with the metrics, traceparent, content opt-in."""

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from otel_llm import FinishReason, RequestInfo
from otel_llm.canonical.instruments import ADAPTER_ATTRIBUTE
from otel_llm.export.finished_spans import (SCOPE as _SCOPE, UNSET as _UNSET, FinishedSpan, RecordedEvent,
                                            _sdk_event_init, _sdk_span_init, own_constructors_match)
from otel_llm.frontend.request_spans import RequestTracer, sampled_context
from tests.otel_llm.conftest import Harness
from tests.otel_llm.frontend.test_request_table import MS, S, run_timeline

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def spans_by_name(h):
    return {s.name: s for s in h.exporter.get_finished_spans()}


def test_tree_shape_attributes_and_exact_timestamps(h):
    run_timeline(h, preempt_in_decode=True)
    spans = spans_by_name(h)
    assert set(spans) == {"chat m", "queue", "prefill", "decode"}
    root = spans["chat m"]
    assert root.kind is SpanKind.SERVER and root.parent is None
    for child in ("queue", "prefill", "decode"):
        assert spans[child].parent.span_id == root.context.span_id
        assert spans[child].context.trace_id == root.context.trace_id
    q, p, d = spans["queue"], spans["prefill"], spans["decode"]
    assert q.end_time == p.start_time and p.end_time == d.start_time  # the phases tile exactly
    assert (q.end_time - q.start_time) == 10 * MS and (p.end_time - p.start_time) == 20 * MS
    assert (p.end_time - p.start_time) + (d.end_time - d.start_time) == d.end_time - p.start_time == 35 * MS
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "m"
    assert a["gen_ai.usage.input_tokens"] == 7 and a["gen_ai.usage.output_tokens"] == 4
    assert a["gen_ai.response.finish_reasons"] == ("length",) and a["gen_ai.request.max_tokens"] == 4
    assert a["gen_ai.latency.time_in_model_prefill"] + a["gen_ai.latency.time_in_model_decode"] == \
        a["gen_ai.latency.time_in_model_inference"]
    assert a["gen_ai.latency.time_to_first_token"] == 40 * MS * 1e-9
    assert root.end_time - root.start_time == 55 * MS  # == the e2e metric
    events = [(e.name, e.timestamp) for e in root.events]
    # first_token where TTFT puts it (when the frontend had the token: after the engine made it, at
    # the prefill span's end), preemptions when the engine had them
    assert events == [("first_token", root.start_time + 40 * MS), ("preempted", d.start_time + 6 * MS)]
    assert p.end_time <= root.start_time + 40 * MS
    for child in (q, p, d):  # one clock: no child outside its parent
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time
    assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a  # content off by default


def test_traceparent_is_honoured():
    h = Harness()
    rid = h.tel.arrival(RequestInfo("r", 3, "text_completion", trace_headers={"traceparent": TRACEPARENT}))
    h.at(S).queued(rid)
    h.rec.finished(rid, FinishReason.ABORT)
    h.step(S, S)
    (root,) = h.exporter.get_finished_spans()  # no token: no phase spans
    assert format(root.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert format(root.parent.span_id, "016x") == "b7ad6b7169203331"
    assert root.kind is SpanKind.INTERNAL and root.name == "text_completion m"
    assert root.attributes["error.type"] == "abort" and not root.status.is_ok


def test_unsampled_parent_means_no_spans():
    h = Harness()
    rid = h.tel.arrival(RequestInfo("r", 3, trace_headers={"traceparent": TRACEPARENT[:-2] + "00"}))
    h.rec.finished(rid, FinishReason.STOP)
    h.step(S, S)
    assert h.exporter.get_finished_spans() == ()


@pytest.mark.parametrize("sampler,sampled", [
    (ALWAYS_ON, 2000), (ALWAYS_OFF, 0), (ParentBased(ALWAYS_ON), 2000), (ParentBased(ALWAYS_OFF), 0),
    (TraceIdRatioBased(0.25), None), (ParentBased(TraceIdRatioBased(0.25)), None)])
def test_root_requests_are_sampled_as_the_providers_sampler_decides(sampler, sampled):
    """A fixed root decision is taken once per sampler (no sampler call per request); a ratio still
    decides per trace id; a sampled parent is followed whatever the root decision."""
    provider = TracerProvider(sampler=sampler)
    tracer = RequestTracer(provider, "m", "otel_llm", False, (0, 0))
    got = sum(tracer.start(RequestInfo(f"r{i}", 3), "chat")[2] != 0 for i in range(2000))
    if sampled is None:
        assert 400 < got < 600  # 25% of 2000, by trace id
    else:
        assert got == sampled
    child = tracer.start(RequestInfo("c", 3, trace_headers={"traceparent": TRACEPARENT}), "chat")
    assert (child[2] != 0) == (type(sampler) is ParentBased or sampler is ALWAYS_ON)
    assert child[3] == int("b7ad6b7169203331", 16)


def test_sampled_context_is_the_sdks_span_context():
    """`sampled_context` builds SpanContext's tuple directly: it must stay equal to the checked one."""
    for remote in (False, True):
        built = sampled_context(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, remote)
        sdk = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, remote,
                          TraceFlags(TraceFlags.SAMPLED))
        assert built == sdk and type(built) is SpanContext
        assert (built.is_valid, built.is_remote, built.trace_flags.sampled, built.trace_state) == \
            (True, remote, True, sdk.trace_state)


def test_content_capture_is_opt_in(monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    h = Harness()
    rid = h.tel.arrival(RequestInfo("r", 3, "chat", input_messages='[{"role":"user"}]'))
    h.tel.set_output(rid, "Paris")
    h.rec.finished(rid, FinishReason.STOP)
    h.step(S, S)
    (root,) = h.exporter.get_finished_spans()
    assert root.attributes["gen_ai.input.messages"] == '[{"role":"user"}]'
    assert "Paris" in root.attributes["gen_ai.output.messages"]


def finish_one(h, info):
    rid = h.tel.arrival(info)
    h.rec.finished(rid, FinishReason.STOP)
    h.step(S, S)
    (root,) = h.exporter.get_finished_spans()
    return root


def test_request_fields_are_cut_at_4096_characters_by_default(h):
    """The SDK bounds only live spans; ours are built retroactively, so they apply the limits themselves,
    and with no OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT a client still cannot make a span as large as it likes."""
    a = finish_one(h, RequestInfo("i" * 5000, 3, stop_sequences=("x" * 1_000_000, "short"))).attributes
    assert a["gen_ai.request.stop_sequences"] == ("x" * 4096, "short")  # element-wise
    assert a["gen_ai.request.id"] == "i" * 4096
    assert a["gen_ai.request.model"] == "m" and a["gen_ai.usage.input_tokens"] == 3


def test_every_long_string_is_cut_without_stop_sequences():
    """Without stop sequences or captured content only the request's own strings are checked per span
    (the model and provider names are bounded once): each of them is still cut."""
    h = Harness(model_name="M" * 5000)
    a = finish_one(h, RequestInfo("i" * 5000, 3, operation="o" * 5000, lora_name="l" * 5000)).attributes
    assert a["gen_ai.request.id"] == a["gen_ai.response.id"] == "i" * 4096
    assert a["gen_ai.operation.name"] == "o" * 4096
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "M" * 4096
    assert a[ADAPTER_ATTRIBUTE] == "l" * 4096


def test_value_length_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "100")
    a = finish_one(Harness(), RequestInfo("r", 3, stop_sequences=("x" * 1000,))).attributes
    assert a["gen_ai.request.stop_sequences"] == ("x" * 100,)


def test_count_limits_keep_the_first_and_count_the_rest(monkeypatch):
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "1")
    h = Harness()
    run_timeline(h, preempt_in_decode=True)
    spans = spans_by_name(h)
    root = spans["chat m"]
    assert list(root.attributes) == ["gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model"]
    assert root.dropped_attributes > 10
    assert [e.name for e in root.events] == ["first_token"] and root.dropped_events == 1  # "preempted" dropped
    assert spans["decode"].attributes == {"gen_ai.operation.name": "chat"}


def test_finished_spans_and_recorded_events_read_and_encode_as_the_sdks():
    """`FinishedSpan` keeps the fields every span shares on its class and `RecordedEvent` shares one
    empty attribute mapping: both must read, encode and print exactly as the SDK's own."""
    resource = TracerProvider().resource
    ctx, parent = sampled_context(0xABC, 0x12), sampled_context(0xABC, 0x34, True)
    for kind, status, events in ((SpanKind.INTERNAL, _UNSET, ()),
                                 (SpanKind.SERVER, Status(StatusCode.ERROR, "request finished with abort"),
                                  (RecordedEvent("first_token", 15),))):
        ours = FinishedSpan("chat m", ctx, parent, resource, {"k": 1}, 10, 20, events, kind, status)
        sdk_events = tuple(Event(e.name, {}, e.timestamp) for e in events)
        sdk = ReadableSpan("chat m", ctx, parent, resource, {"k": 1}, sdk_events, (), kind, None, status, 10, 20,
                           _SCOPE)
        assert ours.to_json() == sdk.to_json()
        assert sdk_encode_spans([ours]) == sdk_encode_spans([sdk])
        assert (ours.links, ours.instrumentation_scope, ours.dropped_events, ours.dropped_links) == \
            (sdk.links, sdk.instrumentation_scope, 0, 0)
    event = RecordedEvent("preempted", 5)
    assert (event.name, event.timestamp, dict(event.attributes), event.dropped_attributes) == ("preempted", 5, {}, 0)
    with pytest.raises(TypeError):
        event.attributes["k"] = "v"  # shared by every event: read-only


def test_an_sdk_whose_spans_hold_more_gets_them_built_by_its_own_constructors():
    """`FinishedSpan` and `RecordedEvent` set exactly the SDK's fields here; where they would not,
    the module builds them with the SDK's constructors, which must give the same spans."""
    assert own_constructors_match() == (True, True)
    resource = TracerProvider().resource
    ctx, parent = sampled_context(0xABC, 0x12), sampled_context(0xABC, 0x34, True)
    status = Status(StatusCode.ERROR, "request finished with abort")
    fast = FinishedSpan("chat m", ctx, parent, resource, {"k": 1}, 10, 20, (RecordedEvent("first_token", 15),),
                        SpanKind.SERVER, status)
    event = RecordedEvent.__new__(RecordedEvent)
    _sdk_event_init(event, "first_token", 15)
    built = FinishedSpan.__new__(FinishedSpan)
    _sdk_span_init(built, "chat m", ctx, parent, resource, {"k": 1}, 10, 20, (event,), SpanKind.SERVER, status)
    assert built.to_json() == fast.to_json()
    assert sdk_encode_spans([built]) == sdk_encode_spans([fast])


def test_child_spans_read_and_encode_as_the_sdks(monkeypatch):
    """A request's queue/prefill/decode spans keep resource, kind, events and status on their class;
    with an SDK whose spans hold more, its own constructor builds them: the same spans either way."""
    import otel_llm.export.finished_spans as finished_spans

    resource = TracerProvider().resource
    ctx, parent = sampled_context(0xABC, 0x12), sampled_context(0xABC, 0x34)
    sdk = ReadableSpan("prefill", ctx, parent, resource, {"gen_ai.operation.name": "chat"}, (), (),
                       SpanKind.INTERNAL, None, _UNSET, 10, 20, _SCOPE)
    ours = finished_spans.child_span_class(resource)("prefill", ctx, parent, {"gen_ai.operation.name": "chat"}, 10, 20)
    monkeypatch.setattr(finished_spans, "_SPANS_MATCH", False)
    fallback = finished_spans.child_span_class(resource)("prefill", ctx, parent, {"gen_ai.operation.name": "chat"},
                                                         10, 20)
    for span in (ours, fallback):
        assert span.to_json() == sdk.to_json()
        assert sdk_encode_spans([span]) == sdk_encode_spans([sdk])
        assert (span.resource, span.events, span.dropped_events, span.status.status_code) == (
            resource, (), 0, StatusCode.UNSET)
    assert type(fallback) is FinishedSpan and type(ours) is not FinishedSpan


def test_span_ids_drawn_together_are_valid_distinct_and_redrawn_when_zero(monkeypatch):
    """The SDK's RandomIdGenerator's ids (a request's trace and root span at arrival, its three children
    at finish) come from one draw each; an id that comes out 0 is drawn again, as the SDK would."""
    import otel_llm.frontend.request_spans as request_spans

    h = Harness()
    run_timeline(h)
    spans = h.exporter.get_finished_spans()
    ids = [s.context.span_id for s in spans]
    assert len(spans) == 4 and len(set(ids)) == 4 and all(0 < i < 1 << 64 for i in ids)
    assert len({s.context.trace_id for s in spans}) == 1 and 0 < spans[0].context.trace_id < 1 << 128
    draws = iter([5 << 128 | 7 << 64 | 0, 0 << 128 | 1 << 64 | 2])  # a span id of 0, then a child id of 0
    monkeypatch.setattr(request_spans, "_getrandbits", lambda bits: next(draws))
    tracer = h.tel.tracer
    hi, lo, span_id, _ = tracer.start(RequestInfo("r", 3), "chat")
    assert span_id != 0 and (hi, lo) != (5, 7)  # redrawn by the generator, whole
    a, b, c = request_spans._three_ids(tracer.provider.id_generator)
    assert 0 not in (a, b, c) and (a, b, c) != (2, 1, 0)


def test_a_providers_own_id_generator_makes_every_id():
    """Ids are drawn in one go only from the SDK's RandomIdGenerator; any other generator (set when
    the provider is made, or later) makes each trace and span id itself."""
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class Counting(IdGenerator):
        def __init__(self):
            self.n = 0

        def generate_span_id(self) -> int:
            self.n += 1
            return self.n

        def generate_trace_id(self) -> int:
            return 0xABC

    h = Harness()
    h.provider.id_generator = Counting()  # after the Telemetry was made
    run_timeline(h)
    spans = h.exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {0xABC}
    assert sorted(s.context.span_id for s in spans) == [1, 2, 3, 4]
