"""OTel readers (in-memory, OTLP over HTTP to a local receiver) and the ASGI /metrics endpoint."""

import asyncio

import httpx
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_llm import StepRecorder, Telemetry, TelemetryConfig
from otel_llm.collector.receiver.otlp_http import OtlpReceiver
from tests.harness.memory_sink import MemorySink
from tests.otel_llm.export.test_exposition import workload


def test_in_memory_reader_gets_canonical_metrics(h):
    workload(h)
    reader = InMemoryMetricReader()
    h.tel.attach_reader(reader)
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    ttft = metrics["gen_ai.server.time_to_first_token"]
    (point,) = ttft.data.data_points
    assert point.count == 5 and point.attributes["gen_ai.operation.name"] == "chat"
    assert point.exemplars and point.exemplars[0].trace_id
    assert metrics["otel_llm.usage.generation_tokens"].data.data_points[0].value == 15
    assert metrics["otel_llm.request.finished"].data.data_points[0].attributes["otel_llm.finish_reason"] == "stop"


def test_otlp_http_export_of_metrics_and_spans():
    from tests.otel_llm.conftest import Harness
    sink = MemorySink()
    with OtlpReceiver(sink) as rx:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{rx.endpoint}/v1/traces")))
        h = Harness(tracer_provider=provider)
        workload(h)
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{rx.endpoint}/v1/metrics"),
                                               export_interval_millis=60_000)
        h.tel.attach_reader(reader)
        reader.collect()
        metrics = {m.name: m for m in sink.wait_for_metrics(1)}
        spans = sink.wait_for_spans(20)
        reader.shutdown()
    e2e = metrics["gen_ai.server.request.duration"]
    assert e2e.kind == "histogram" and sum(p.count for p in e2e.points) == 5
    assert any(p.exemplars for p in e2e.points)
    assert metrics["otel_llm.usage.prompt_tokens"].points[0].value == 60
    roots = [s for s in spans if s.name == "chat m"]
    assert len(roots) == 5 and {s.name for s in spans} == {"chat m", "queue", "prefill", "decode"}
    assert all(r.attributes["gen_ai.usage.output_tokens"] == 3 for r in roots)


def test_asgi_metrics_app_negotiates_and_rejects_post(h):
    workload(h)
    app = h.tel.metrics_app

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            text = await c.get("/metrics")
            om = await c.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
            post = await c.post("/metrics")
            return text, om, post

    text, om, post = asyncio.run(go())
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "vllm:e2e_request_latency_seconds_count" in text.text
    assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.endswith("# EOF\n")
    assert post.status_code == 405


def test_disabled_records_nothing():
    tel = Telemetry(TelemetryConfig(model_name="m", enabled=False))
    rec = StepRecorder(enabled=False)
    assert tel.arrival(None) == -1  # never even looks at its argument
    rec.queued(1)
    rec.outputs([1], 1)
    assert rec.end_step_bytes() is None
    tel.ingest(None)
    assert tel.render() == b"" and not hasattr(tel, "table")


def test_the_otlp_destination_is_shown_as_the_exporters_resolve_it(monkeypatch):
    from otel_llm.export.otlp_endpoint import otlp_destination

    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"):
        monkeypatch.delenv(var, raising=False)
    assert otlp_destination("metrics") == "http://localhost:4318/v1/metrics (http/protobuf)"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:secret@collector:4318/")
    assert otlp_destination("metrics") == "http://xxxxx@collector:4318/v1/metrics (http/protobuf)"  # no credentials
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:9/custom")
    assert otlp_destination("metrics") == "http://m:9/custom (http/protobuf)"  # the signal's own: as is
    assert otlp_destination("metrics", "http://c:4318") == "http://c:4318/v1/metrics (http/protobuf)"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    assert otlp_destination("metrics") == "http://xxxxx@collector:4318/ (grpc)"  # gRPC: the endpoint as is
