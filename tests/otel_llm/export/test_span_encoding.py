"""The direct OTLP span encoder: the same message as the SDK's encoder, and the exporter built on it."""

import logging

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from otel_llm.collector.receiver.otlp_http import OtlpReceiver
from otel_llm.export.otlp_traces import otlp_span_exporter
from otel_llm.export.span_encoding import FastOTLPSpanExporter, encode_spans
from tests.harness.memory_sink import MemorySink
from tests.otel_llm.conftest import Harness
from tests.otel_llm.frontend.test_request_table import run_timeline

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
ODD_VALUES = {
    "str": "é ü 😀", "empty": "", "true": True, "false": False, "zero": 0, "neg": -7, "big": 2**63 - 1,
    "min": -(2**63), "float": 0.25, "fzero": 0.0, "bytes": b"\x00\xff", "strs": ("a", ""), "ints": [1, -2, 300],
    "floats": (1.5,), "bools": (True, False), "empty_seq": (), "map": {"k": "v", "n": {"deep": 1}},
}


def parsed(data: bytes) -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(data)
    return msg


def assert_same_as_sdk(spans):
    assert parsed(encode_spans(spans)) == sdk_encode_spans(spans)


def test_request_span_trees_encode_like_the_sdk():
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for _ in range(3):
        h = Harness(tracer_provider=provider)
        run_timeline(h, preempt_in_decode=True)
    spans = exporter.get_finished_spans()
    assert len(spans) == 12
    assert_same_as_sdk(spans)


def test_every_field_and_value_type_encodes_like_the_sdk():
    resource = Resource({"service.name": "s", "n": 3}, schema_url="https://r")
    other = Resource({"service.name": "other"})
    scope = InstrumentationScope("lib", "1.2", "https://s", {"scope.attr": True})
    parent = SpanContext(0xABC, 0x123, True, SAMPLED, TraceState([("vendor", "x1")]))
    ctx = SpanContext(0xABC, 0x456, False, SAMPLED, TraceState([("k", "v"), ("k2", "v2")]))
    link = Link(SpanContext(0xDEF, 0x789, False, SAMPLED), {"link.attr": 1})
    full = ReadableSpan("full", ctx, parent, resource, ODD_VALUES, [Event("e", {"a": 1.5}, 99), Event("bare", {}, 100)],
                        [link], SpanKind.CLIENT, None, Status(StatusCode.ERROR, "boom"), 10, 20, scope)
    local_parent = SpanContext(0xABC, 0x999, False, SAMPLED)
    spans = [
        full,
        ReadableSpan("ok", SpanContext(1, 2, False, SAMPLED), local_parent, resource, {}, (), (), SpanKind.PRODUCER,
                     None, Status(StatusCode.OK), 1, 2, scope),
        ReadableSpan("no scope", SpanContext(1, 3, False, SAMPLED), None, other, {"x": "y"}, (), (), SpanKind.CONSUMER,
                     None, Status(StatusCode.UNSET), 0, 0, None),
        ReadableSpan("same resource, no scope", SpanContext(1, 4, False, SAMPLED), None, resource, None, (), (),
                     SpanKind.SERVER, None, Status(StatusCode.UNSET), 5, 6, None),
    ]
    assert_same_as_sdk(spans)


def test_values_it_cannot_encode_raise_type_error():
    ctx = SpanContext(1, 2, False, SAMPLED)
    for bad in ({"x": object()}, {"x": 2**63}):
        span = ReadableSpan("s", ctx, None, Resource({}), {}, (), (), SpanKind.INTERNAL, None, Status(StatusCode.UNSET),
                            1, 2, None)
        span._attributes = bad  # the SDK's BoundedAttributes would have refused it; a custom processor might not
        with pytest.raises(TypeError):
            encode_spans([span])


def test_http_exporter_is_the_fast_one_and_spans_arrive(caplog):
    sink = MemorySink()
    with OtlpReceiver(sink) as rx:
        exporter = otlp_span_exporter(rx.endpoint)  # /v1/traces appended
        assert isinstance(exporter, FastOTLPSpanExporter)
        assert exporter.fast, "the installed SDK's HTTP exporter no longer has the client the fast path uses"
        provider = TracerProvider()
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        h = Harness(tracer_provider=provider)
        run_timeline(h, preempt_in_decode=True)
        spans = memory.get_finished_spans()
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        odd = ReadableSpan("odd", SpanContext(5, 6, False, SAMPLED), None, Resource({}), {}, (), (), SpanKind.INTERNAL,
                           None, Status(StatusCode.UNSET), 1, 2, None)
        odd._attributes = {"weird": object(), "fine": 1}  # the SDK's encoder takes over: it logs and skips the value
        with caplog.at_level(logging.ERROR):
            assert exporter.export([odd]) is SpanExportResult.SUCCESS
        assert "weird" in caplog.text
        received = sink.wait_for_spans(5)
        exporter.shutdown()
    by_name = {s.name: s for s in received}
    assert set(by_name) == {"chat m", "queue", "prefill", "decode", "odd"}
    assert by_name["odd"].attributes == {"fine": 1}
    root = by_name["chat m"]
    assert root.attributes["gen_ai.usage.output_tokens"] == 4
    assert root.attributes["gen_ai.response.finish_reasons"] == ("length",)


def test_exporter_to_a_dead_endpoint_fails_without_raising():
    exporter = FastOTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces", timeout=1)
    span = ReadableSpan("s", SpanContext(1, 2, False, SAMPLED), None, Resource({}), {}, (), (), SpanKind.INTERNAL,
                        None, Status(StatusCode.UNSET), 1, 2, None)
    assert exporter.export([span]) is SpanExportResult.FAILURE


def test_a_lone_surrogate_costs_no_span_of_the_batch():
    """A string UTF-8 cannot encode ("\\ud800", which JSON escapes allow) in one span's attribute, name,
    event or status: the batch (20 other spans) still arrives whole at a real receiver through the
    processor the server uses; each such character is U+FFFD there, and counted."""
    from otel_llm.export.otlp_traces import batch_span_processor
    from otel_llm.export.span_encoding import replaced_characters

    sink = MemorySink()
    with OtlpReceiver(sink) as rx:
        provider = TracerProvider()
        provider.add_span_processor(batch_span_processor(otlp_span_exporter(rx.endpoint)))
        tracer = provider.get_tracer("t")
        before = replaced_characters()
        for i in range(10):
            tracer.start_span(f"fine-{i}", attributes={"gen_ai.request.model": "m"}).end()
        bad = tracer.start_span("bad \ud800 name", attributes={"gen_ai.request.stop_sequences": ("ok", "x\ud800y"),
                                                               "gen_ai.request.model": "\udfff"})
        bad.add_event("ev\ud801")
        bad.set_status(Status(StatusCode.ERROR, "why \ud802"))
        bad.end()
        for i in range(10):
            tracer.start_span(f"after-{i}").end()
        provider.force_flush()
        received = sink.wait_for_spans(21)
        provider.shutdown()
    assert len(received) == 21
    [got] = [s for s in received if s.name.startswith("bad")]
    assert got.name == "bad \ufffd name"
    assert got.attributes["gen_ai.request.stop_sequences"] == ("ok", "x\ufffdy")
    assert got.attributes["gen_ai.request.model"] == "\ufffd"
    assert replaced_characters() - before == 5
