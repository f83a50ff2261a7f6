import gzip
import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from google.rpc import status_pb2
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult

from otel_llm.collector.http_endpoint import HttpServerSettings
from otel_llm.collector.receiver.otlp_http import OtlpReceiver, OtlpReceiverConfig, ReceiverStats, Signal
from tests.harness.memory_sink import MemorySink

RESOURCE = Resource.create({"service.name": "otel-llm-test"})
TRACE_ID = "5b8efff798038103d269b633813fc60c"
SPAN_ID = "eee19b7ec3c1b174"
PARENT_ID = "eee19b7ec3c1b173"


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def one_span_protobuf() -> bytes:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.name = "probe"
    span.trace_id = bytes.fromhex(TRACE_ID)
    span.span_id = bytes.fromhex(SPAN_ID)
    return request.SerializeToString()


def assert_still_serves(receiver: OtlpReceiver, sink: MemorySink) -> None:
    before = len(sink.received_spans())
    status, _, _ = post(
        f"{receiver.endpoint}/v1/traces",
        one_span_protobuf(),
        {"Content-Type": "application/x-protobuf"},
    )
    assert status == 200
    assert len(sink.received_spans()) == before + 1


def reason(body: bytes) -> str:
    status = status_pb2.Status()
    status.ParseFromString(body)
    return status.message


# Real OpenTelemetry SDK + OTLP/HTTP exporters


def test_spans_from_real_exporter(receiver: OtlpReceiver, sink: MemorySink) -> None:
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces"))
    )
    tracer = provider.get_tracer("otel-llm.test")
    with tracer.start_as_current_span("chat m", kind=trace.SpanKind.SERVER) as parent:
        parent.set_attribute("gen_ai.request.model", "m")
        parent.set_attribute("gen_ai.usage.input_tokens", 12)
        with tracer.start_as_current_span("llm_request") as child:
            child.add_event("first_token", {"gen_ai.token.index": 0}, timestamp=1_000)
            child.set_attribute("tags", ["a", "b"])
    provider.shutdown()

    spans = {s.name: s for s in sink.received_spans()}
    assert set(spans) == {"chat m", "llm_request"}
    root, leaf = spans["chat m"], spans["llm_request"]
    ctx = parent.get_span_context()
    assert root.trace_id == f"{ctx.trace_id:032x}" == leaf.trace_id
    assert root.span_id == f"{ctx.span_id:016x}"
    assert root.parent_span_id == ""
    assert leaf.parent_span_id == root.span_id
    assert root.kind == "SERVER" and leaf.kind == "INTERNAL"
    assert root.attributes == {"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 12}
    assert leaf.attributes == {"tags": ("a", "b")}
    assert leaf.events == (("first_token", 1_000, {"gen_ai.token.index": 0}),)
    assert root.start_time_ns <= leaf.start_time_ns <= leaf.end_time_ns <= root.end_time_ns
    assert root.resource_attributes["service.name"] == "otel-llm-test"
    assert root.scope_name == "otel-llm.test"
    assert root.status_code == "UNSET"


def test_batched_gzip_spans(receiver: OtlpReceiver, sink: MemorySink) -> None:
    exporter = OTLPSpanExporter(
        endpoint=f"{receiver.endpoint}/v1/traces", compression=Compression.Gzip
    )
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=64))
    tracer = provider.get_tracer("batch")
    for i in range(300):
        with tracer.start_as_current_span(f"s{i}") as span:
            span.set_attribute("i", i)
    assert provider.force_flush()
    provider.shutdown()

    spans = sink.received_spans()
    assert sorted(s.attributes["i"] for s in spans) == list(range(300))
    assert receiver.stats().accepted >= 300 // 64
    assert receiver.stats().rejected == 0


def test_metrics_from_real_exporter(receiver: OtlpReceiver, sink: MemorySink) -> None:
    exporter = OTLPMetricExporter(endpoint=f"{receiver.endpoint}/v1/metrics")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    meter_provider = MeterProvider(metric_readers=[reader], resource=RESOURCE)
    tracer_provider = TracerProvider(resource=RESOURCE)
    meter = meter_provider.get_meter("otel-llm.test")
    tracer = tracer_provider.get_tracer("otel-llm.test")

    counter = meter.create_counter("gen_ai.client.token.usage.count", unit="{token}")
    histogram = meter.create_histogram(
        "gen_ai.server.time_to_first_token",
        unit="s",
        explicit_bucket_boundaries_advisory=[0.1, 0.5, 1.0],
    )
    labels = {"gen_ai.request.model": "m"}
    counter.add(5, labels)
    counter.add(7, labels)
    for value in (0.05, 0.3, 2.0):
        histogram.record(value, labels)
    with tracer.start_as_current_span("request") as span:
        histogram.record(0.4, labels)  # sampled span -> exemplar in bucket (0.1, 0.5]
    assert meter_provider.force_flush()
    # Read before shutdown: its final export repeats the cumulative points without exemplars.
    metrics = {m.name: m for m in sink.received_metrics()}
    meter_provider.shutdown()
    tracer_provider.shutdown()

    total = metrics["gen_ai.client.token.usage.count"]
    assert total.kind == "sum" and total.is_monotonic and total.temporality == "CUMULATIVE"
    assert total.unit == "{token}"
    assert [(p.attributes, p.value) for p in total.points] == [(labels, 12)]

    ttft = metrics["gen_ai.server.time_to_first_token"]
    assert ttft.kind == "histogram" and ttft.unit == "s"
    (point,) = ttft.points
    assert point.attributes == labels
    assert point.explicit_bounds == (0.1, 0.5, 1.0)
    assert point.bucket_counts == (1, 2, 0, 1)
    assert point.count == 4
    assert point.sum == pytest.approx(2.75)
    assert (point.min, point.max) == (0.05, 2.0)
    ctx = span.get_span_context()
    exemplar = next(e for e in point.exemplars if e.span_id)
    assert exemplar.value == 0.4
    assert exemplar.trace_id == f"{ctx.trace_id:032x}"
    assert exemplar.span_id == f"{ctx.span_id:016x}"
    assert ttft.resource_attributes["service.name"] == "otel-llm-test"


# OTLP JSON


def test_otlp_json_with_hex_ids(receiver: OtlpReceiver, sink: MemorySink) -> None:
    document = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "js"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "json"},
                        "spans": [
                            {
                                "traceId": TRACE_ID,
                                "spanId": SPAN_ID,
                                "parentSpanId": PARENT_ID,
                                "name": "from-json",
                                "kind": 2,
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000000500000000",
                                "attributes": [
                                    {"key": "n", "value": {"intValue": "3"}},
                                    {"key": "ok", "value": {"boolValue": True}},
                                ],
                                "events": [{"name": "e", "timeUnixNano": "1700000000100000000"}],
                                "someFutureField": 1,
                            }
                        ],
                    }
                ],
            }
        ]
    }
    status, content_type, body = post(
        f"{receiver.endpoint}/v1/traces",
        json.dumps(document).encode(),
        {"Content-Type": "application/json; charset=utf-8"},
    )
    assert (status, content_type) == (200, "application/json")
    assert json.loads(body) == {}
    (span,) = sink.received_spans()
    assert (span.trace_id, span.span_id, span.parent_span_id) == (TRACE_ID, SPAN_ID, PARENT_ID)
    assert span.kind == "SERVER"
    assert span.end_time_ns - span.start_time_ns == 500_000_000
    assert span.attributes == {"n": 3, "ok": True}
    assert span.events == (("e", 1_700_000_000_100_000_000, {}),)
    assert span.resource_attributes == {"service.name": "js"}


def test_protobuf_response_is_empty_export_response(receiver: OtlpReceiver) -> None:
    status, content_type, body = post(
        f"{receiver.endpoint}/v1/traces",
        gzip.compress(one_span_protobuf()),
        {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
    )
    assert (status, content_type) == (200, "application/x-protobuf")
    response = ExportTraceServiceResponse()
    response.ParseFromString(body)
    assert not response.HasField("partial_success")


# Bad input: clear answer, nothing reaches the sink, the receiver keeps serving


@pytest.mark.parametrize(
    ("path", "headers", "body", "status", "words"),
    [
        ("/v1/traces", {"Content-Type": "application/x-protobuf"}, b"\xff\xff\xff\xff\xff", 400, "malformed protobuf"),
        ("/v1/metrics", {"Content-Type": "application/x-protobuf"}, b"\x0a\x05ab", 400, "malformed protobuf"),
        ("/v1/traces", {"Content-Type": "application/json"}, b"{not json", 400, "malformed OTLP JSON"),
        ("/v1/traces", {"Content-Type": "application/json"}, b"[1, 2]", 400, "not an object"),
        ("/v1/traces", {"Content-Type": "application/json"}, b'{"resourceSpans": 5}', 400, "malformed OTLP JSON"),
        ("/v1/traces", {"Content-Type": "application/json"}, b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', 400, "not hex"),
        ("/v1/traces", {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}, b"not gzip", 400, "invalid gzip"),
        ("/v1/traces", {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}, gzip.compress(one_span_protobuf())[:-12], 400, "truncated gzip"),
        ("/v1/traces", {"Content-Type": "application/x-protobuf", "Content-Encoding": "br"}, b"x", 415, "Content-Encoding"),
        ("/v1/traces", {"Content-Type": "text/plain"}, b"hello", 415, "unsupported Content-Type"),
        ("/v1/traces", {}, b"hello", 415, "unsupported Content-Type"),
        ("/v1/spans", {"Content-Type": "application/x-protobuf"}, b"", 404, "unknown path"),
    ],
)  # fmt: skip
def test_bad_input_is_rejected_with_reason(
    receiver: OtlpReceiver,
    sink: MemorySink,
    path: str,
    headers: dict[str, str],
    body: bytes,
    status: int,
    words: str,
) -> None:
    got_status, content_type, got_body = post(receiver.endpoint + path, body, headers)
    assert got_status == status
    if content_type == "application/x-protobuf":
        message = reason(got_body)
    elif content_type == "application/json":
        message = json.loads(got_body)["message"]
    else:
        assert content_type.startswith("text/plain")
        message = got_body.decode()
    assert words in message
    assert sink.received_spans() == () and sink.received_metrics() == ()
    assert receiver.stats() == ReceiverStats(accepted=0, rejected=1, failed=0)
    assert_still_serves(receiver, sink)


def test_get_is_not_allowed(receiver: OtlpReceiver, sink: MemorySink) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{receiver.endpoint}/v1/traces", timeout=10)
    assert err.value.code == 405
    assert "use POST" in err.value.read().decode()
    assert_still_serves(receiver, sink)


def test_payload_limit_raw_and_decompressed() -> None:
    sink = MemorySink()
    with OtlpReceiver(sink, OtlpReceiverConfig(max_body_bytes=4096)) as rx:
        url = f"{rx.endpoint}/v1/traces"
        big = b"\x00" * 5000
        status, _, body = post(url, big, {"Content-Type": "application/x-protobuf"})
        assert status == 413 and "exceeds the limit of 4096 bytes" in reason(body)
        assert_still_serves(rx, sink)

        bomb = gzip.compress(b"\x00" * 1_000_000)  # ~1 KiB on the wire
        assert len(bomb) < 4096
        status, _, body = post(
            url, bomb, {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
        )
        assert status == 413 and "decompressed body exceeds" in reason(body)
        assert_still_serves(rx, sink)


def test_real_exporter_reports_failure_on_rejection() -> None:
    sink = MemorySink()
    with OtlpReceiver(sink, OtlpReceiverConfig(max_body_bytes=256)) as rx:
        exporter = OTLPSpanExporter(endpoint=f"{rx.endpoint}/v1/traces")
        provider = TracerProvider(resource=RESOURCE)
        tracer = provider.get_tracer("big")
        with tracer.start_as_current_span("big") as span:
            span.set_attribute("payload", "x" * 1000)
        assert exporter.export([span]) is SpanExportResult.FAILURE
        assert rx.stats().rejected == 1
        assert_still_serves(rx, sink)
        exporter.shutdown()


def test_sink_error_is_500_and_receiver_survives() -> None:
    calls = []

    def failing_sink(signal: Signal, request: object) -> None:
        calls.append(signal)
        raise RuntimeError("boom")

    with OtlpReceiver(failing_sink) as rx:
        for _ in range(2):
            status, _, body = post(
                f"{rx.endpoint}/v1/traces",
                one_span_protobuf(),
                {"Content-Type": "application/x-protobuf"},
            )
            assert status == 500 and "internal error" in reason(body)
        assert calls == [Signal.TRACES, Signal.TRACES]
        assert rx.stats() == ReceiverStats(accepted=0, rejected=0, failed=2)


@pytest.mark.parametrize(
    "kwargs",
    [{"port": 70000}, {"max_body_bytes": 0}, {"host": ""}],
)
def test_config_errors_name_the_bad_value(kwargs: dict) -> None:
    (name,) = kwargs
    with pytest.raises(ValueError, match=name):
        OtlpReceiverConfig(**kwargs)


def test_stalled_client_is_dropped_and_receiver_survives() -> None:
    sink = MemorySink()
    with OtlpReceiver(sink, OtlpReceiverConfig(server=HttpServerSettings(body_timeout_s=0.2))) as rx:
        host, port = rx.endpoint.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/x-protobuf\r\nContent-Length: 100\r\n\r\n0123456789"
            )
            assert sock.recv(1024) == b""  # closed after the timeout, without an answer
        assert_still_serves(rx, sink)
        assert rx.stats() == ReceiverStats(accepted=1, rejected=0, failed=0)


def test_connections_beyond_the_cap_get_503_and_the_receiver_recovers() -> None:
    sink = MemorySink()
    with OtlpReceiver(sink, OtlpReceiverConfig(server=HttpServerSettings(max_connections=3))) as rx:
        host, port = rx.endpoint.removeprefix("http://").split(":")
        held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]  # hold every thread
        try:
            time.sleep(0.2)
            request = urllib.request.Request(f"{rx.endpoint}/v1/traces", one_span_protobuf(),
                                             {"Content-Type": "application/x-protobuf"})
            with pytest.raises(urllib.error.HTTPError) as refused:  # read as an answer, not a reset
                urllib.request.urlopen(request, timeout=10)
            assert (refused.value.code, refused.value.headers["Retry-After"]) == (503, "1")
            assert rx.stats().refused_connections == 1 and sink.received_spans() == ()  # no fourth thread
        finally:
            for s in held:
                s.close()
        deadline = time.time() + 5
        while time.time() < deadline:  # the held threads notice their closed connections and end
            if post(f"{rx.endpoint}/v1/traces", one_span_protobuf(), {"Content-Type": "application/x-protobuf"})[0] == 200:
                break
            time.sleep(0.1)
        assert len(sink.received_spans()) == 1


@pytest.mark.parametrize("field", ["kind", "status", "temporality"])
def test_unknown_enum_values_from_a_newer_sender_are_accepted(receiver: OtlpReceiver, sink: MemorySink, field) -> None:
    """Valid on the wire (OTLP enums are open): kept as the number, never a 500."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    if field == "temporality":
        request = ExportMetricsServiceRequest()
        metric = request.resource_metrics.add().scope_metrics.add().metrics.add(name="m")
        metric.sum.aggregation_temporality = 99
        metric.sum.data_points.add(as_int=1)
        status, _, _ = post(f"{receiver.endpoint}/v1/metrics", request.SerializeToString(),
                            {"Content-Type": "application/x-protobuf"})
        assert status == 200 and sink.received_metrics()[0].temporality == "99"
        return
    request = ExportTraceServiceRequest.FromString(one_span_protobuf())
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.kind, span.status.code = (999, 0) if field == "kind" else (1, 7)
    status, _, _ = post(f"{receiver.endpoint}/v1/traces", request.SerializeToString(),
                        {"Content-Type": "application/x-protobuf"})
    assert status == 200
    [got] = sink.received_spans()
    assert (got.kind, got.status_code) == (("999", "UNSET") if field == "kind" else ("INTERNAL", "7"))
