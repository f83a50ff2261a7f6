"""Span trees: shape, attributes, timestamps consistent with the metrics, traceparent, content opt-in."""

from opentelemetry.trace import SpanKind

from otel_llm import FinishReason, RequestInfo
from tests.otel_llm.conftest import Harness
from tests.otel_llm.test_request_table import MS, S, run_timeline

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
    assert events == [("first_token", p.end_time), ("preempted", d.start_time + 6 * MS)]
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
