"""The collector's traces pipeline with real parts: OTel SDK exporters (HTTP and gRPC) and a real
`otel-llm serve` as sources, two OTLP backends (receivers started here), one of them down and
then back; spans with ids OTLP forbids refused as a partial success over every transport."""

from __future__ import annotations

import base64
import json

import grpc
import httpx
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_llm.collector.processor.tail_sampling import TailSamplingConfig
from otel_llm.collector.receiver.otlp_grpc import OtlpGrpcReceiver, OtlpGrpcReceiverConfig
from otel_llm.collector.receiver.otlp_http import OtlpReceiver
from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.collector.tracestore.store import TraceStoreConfig
from tests.collector.otlp_builders import SEC, kvs, samples
from tests.harness import free_port
from tests.harness.memory_sink import MemorySink
from tests.server.api.api_server_harness import ServerProcess, wait_until


def collector_with(*traces_to: str) -> Collector:
    return Collector(CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, traces_to=traces_to))


def send_spans(exporter, service: str, n: int) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=64))
    tracer = provider.get_tracer("test")
    for i in range(n):
        with tracer.start_as_current_span(f"{service} {i}"):
            pass
    assert provider.force_flush(10_000)
    provider.shutdown()


def names(sink: MemorySink) -> list[str]:
    return [s.name for s in sink.received_spans()]


def own_metrics(collector: Collector) -> dict[str, float]:
    return samples(collector.render().decode())


def test_sdk_spans_reach_a_healthy_backend_at_once_and_a_recovered_one_after():
    healthy, late = MemorySink(), MemorySink()
    late_port = free_port()
    with OtlpReceiver(healthy) as backend, collector_with(f"{backend.endpoint}/v1/traces",
                                                          f"grpc://127.0.0.1:{late_port}") as collector:
        send_spans(HttpSpanExporter(endpoint=f"{collector.http.endpoint}/v1/traces"), "over-http", 300)
        send_spans(GrpcSpanExporter(endpoint=collector.grpc.endpoint, insecure=True), "over-grpc", 200)
        assert wait_until(lambda: len(names(healthy)) == 500, timeout_s=10), len(names(healthy))
        assert names(late) == []  # its backend is still down: retried, not lost, and not in the way
        with OtlpGrpcReceiver(late, OtlpGrpcReceiverConfig(port=late_port)):
            assert wait_until(lambda: len(names(late)) == 500, timeout_s=20), len(names(late))
            got = {n: sorted(names(sink)) for n, sink in (("healthy", healthy), ("late", late))}
            assert got["healthy"] == got["late"] == sorted([f"over-http {i}" for i in range(300)] +
                                                          [f"over-grpc {i}" for i in range(200)])
            sent = [f'otelcol_exporter_sent_spans_total{{exporter="{e}",data_type="traces"}}'
                    for e in ("otlphttp/0", "otlp/1")]
            # a backend has the spans a moment before its exporter's send returns and is counted
            assert wait_until(lambda: all(own_metrics(collector)[k] == 500 for k in sent), timeout_s=10)
            own = own_metrics(collector)
    assert own['otelcol_receiver_accepted_spans_total{receiver="otlp",transport="http"}'] == 300
    assert own['otelcol_receiver_accepted_spans_total{receiver="otlp",transport="grpc"}'] == 200
    for exporter in ("otlphttp/0", "otlp/1"):
        labels = f'{{exporter="{exporter}",data_type="traces"}}'
        assert own[f"otelcol_exporter_sent_spans_total{labels}"] == 500
        assert own[f"otelcol_exporter_send_failed_spans_total{labels}"] == 0
        assert own[f"otelcol_exporter_queue_capacity{labels}"] == 1000


def test_bad_trace_input_is_refused_and_nothing_is_forwarded():
    sink = MemorySink()
    with OtlpReceiver(sink) as backend, collector_with(f"{backend.endpoint}/v1/traces") as collector:
        bad = httpx.post(f"{collector.http.endpoint}/v1/traces", content=b"\x0a\xff\xff",
                         headers={"Content-Type": "application/x-protobuf"}, timeout=10)
        assert bad.status_code == 400 and b"malformed protobuf ExportTraceServiceRequest" in bad.content
        junk = httpx.post(f"{collector.http.endpoint}/v1/traces", content=b"{not json",
                          headers={"Content-Type": "application/json"}, timeout=10)
        assert junk.status_code == 400
        assert collector.render()  # still serving
    assert names(sink) == []


@pytest.mark.slow
def test_a_real_servers_request_spans_pass_through():
    sink = MemorySink()
    with OtlpReceiver(sink) as backend, collector_with(f"{backend.endpoint}/v1/traces") as collector:
        server = ServerProcess("--otlp-traces-endpoint", f"{collector.http.endpoint}/v1/traces",
                               env={"OTEL_BSP_SCHEDULE_DELAY": "200"}).start()
        try:
            for _ in range(3):
                r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                               json={"model": "dummy", "prompt": "hi", "max_tokens": 4})
                assert r.status_code == 200
            assert wait_until(lambda: names(sink).count("text_completion dummy") == 3, timeout_s=20), names(sink)
        finally:
            server.stop()
    spans = sink.received_spans()
    assert {"queue", "prefill", "decode"} <= {s.name for s in spans}


def test_a_stalled_backend_holds_up_nothing_and_its_queue_stays_bounded():
    """One backend accepts connections and never answers: the healthy one still gets every span at once,
    the stalled one's queue stays within its bounds, and what it cannot keep is counted."""
    from otel_llm.collector.exporter.otlp import OtlpExporter, OtlpExporterConfig
    from otel_llm.collector.exporter.queue import QueueConfig
    from otel_llm.collector.trace_pipeline import TracePipeline
    from tests.collector.exporter.test_otlp import spans_request
    from tests.harness.scripted_http import ScriptedReceiver

    stalled = ScriptedReceiver()
    stalled.hold.clear()  # every answer waits (10 s)
    healthy = MemorySink()
    body = spans_request(100)
    with OtlpReceiver(healthy) as backend:
        exporters = [OtlpExporter(OtlpExporterConfig(f"{backend.endpoint}/v1/traces", name="otlphttp/0")),
                     OtlpExporter(OtlpExporterConfig(stalled.url, name="otlphttp/1", timeout_s=30,
                                                       queue=QueueConfig(queue_size=5, max_bytes=4 * len(body))))]
        pipeline = TracePipeline(exporters)
        for e in exporters:
            e.start()
        try:
            for _ in range(50):
                assert pipeline.consume(body) == (100, 0, "")  # never blocks on the stalled backend
            assert wait_until(lambda: len(healthy.received_spans()) == 5000, timeout_s=10)
            stats = exporters[1].stats()
            assert stats.queue_size <= 4 and stats.enqueue_failed >= (50 - 4 - 5) * 100 and stats.sent == 0
        finally:
            for e in exporters:
                e.stop(0.2)
            stalled.close()


def spans_with_bad_ids(trace_id: bytes) -> list[Span]:
    """Three good spans of `trace_id`, and two OTLP forbids: a 3-byte trace id, an empty span id."""
    good = [Span(trace_id=trace_id, span_id=bytes([9, i]) * 4, name=f"good {i}", start_time_unix_nano=SEC,
                 end_time_unix_nano=2 * SEC) for i in range(1, 4)]
    return good + [Span(trace_id=b"\x01\x02\x03", span_id=bytes([7]) * 8, name="short trace id"),
                   Span(trace_id=trace_id, span_id=b"", name="no span id")]


def traces_request(spans: list[Span]) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource={"attributes": kvs({"service.name": "app"})}, scope_spans=[ScopeSpans(spans=spans)])])


def otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """OTLP JSON: protobuf's JSON mapping with the ids in hex instead of base64."""
    document = json_format.MessageToDict(request)
    for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId"):
            if key in span:
                span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(document).encode()


@pytest.mark.parametrize("sampling", [None, TailSamplingConfig(keep_fraction=1.0)], ids=["as_received", "tail_sampled"])
def test_spans_with_invalid_ids_are_refused_as_a_partial_success_and_the_rest_taken(tmp_path, sampling):
    trace_ids = {via: bytes([n]) * 16 for n, via in enumerate(("protobuf", "json", "grpc"), 1)}
    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(tmp_path)), tail_sampling=sampling)
    with Collector(config) as collector:
        url = f"{collector.http.endpoint}/v1/traces"
        answers = {}
        answer = httpx.post(url, content=traces_request(spans_with_bad_ids(trace_ids["protobuf"])).SerializeToString(),
                            headers={"Content-Type": "application/x-protobuf"}, timeout=10)
        assert answer.status_code == 200
        answers["protobuf"] = ExportTraceServiceResponse.FromString(answer.content).partial_success
        answer = httpx.post(url, content=otlp_json(traces_request(spans_with_bad_ids(trace_ids["json"]))),
                            headers={"Content-Type": "application/json"}, timeout=10)
        assert answer.status_code == 200
        answers["json"] = json_format.Parse(answer.content, ExportTraceServiceResponse()).partial_success
        with grpc.insecure_channel(collector.grpc.endpoint) as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                         request_serializer=ExportTraceServiceRequest.SerializeToString,
                                         response_deserializer=ExportTraceServiceResponse.FromString)
            answers["grpc"] = export(traces_request(spans_with_bad_ids(trace_ids["grpc"])), timeout=10).partial_success
        for via, partial in answers.items():
            assert partial.rejected_spans == 2, via
            assert partial.error_message == "trace_id is 3 bytes, not 16 (1 span); span_id is 0 bytes, not 8 (1 span)"
        # the good spans of the same requests are stored (a bad one in a store batch used to cost all of it)
        store = collector.trace_store
        assert wait_until(lambda: all(len(store.trace(t.hex())) == 3 for t in trace_ids.values()), timeout_s=10)
        assert {s.span.name for s in store.trace(trace_ids["json"].hex())} == {"good 1", "good 2", "good 3"}
        own = own_metrics(collector)
    for transport, refused, accepted in (("http", 4, 6), ("grpc", 2, 3)):
        labels = f'{{receiver="otlp",transport="{transport}"}}'
        assert own[f"otelcol_receiver_refused_spans_total{labels}"] == refused
        assert own[f"otelcol_receiver_accepted_spans_total{labels}"] == accepted
    assert own['otelcol_exporter_send_failed_spans_total{exporter="tracestore",data_type="traces"}'] == 0
