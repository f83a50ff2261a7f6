"""The frontend side in an API server: `/metrics` mounted in FastAPI (every profile, both formats),
request spans parented on the client's `traceparent`, Triton statistics, and a standard OTel
MetricReader collecting the same aggregates. In-memory exporters stand in for OTLP here.
Run: python docs_src/sdk_frontend.py"""

from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import FinishReason, RequestInfo, StepRecorder, Telemetry, TelemetryConfig
from otel_llm.export.otlp_metrics import service_resource

spans = InMemorySpanExporter()  # in production: an OTLP exporter (or leave tracer_provider out and set
provider = TracerProvider()  # OTEL_EXPORTER_OTLP_ENDPOINT / otlp_traces_endpoint: Telemetry builds one)
provider.add_span_processor(SimpleSpanProcessor(spans))

tel = Telemetry(TelemetryConfig(model_name="my-model", max_model_len=8192, tracer_provider=provider))
app = FastAPI()
app.mount("/metrics", tel.metrics_app)  # vLLM names by default; TelemetryConfig(metrics_compat="otel")

reader = InMemoryMetricReader()  # or otlp_metric_reader(endpoint) from otel_llm.export.otlp_metrics
tel.attach_reader(reader, service_resource("my-server"))  # service.name, a unique service.instance.id

traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
rid = tel.arrival(RequestInfo("chatcmpl-1", prompt_tokens=37, operation="chat", max_tokens=64,
                              stream=True, trace_headers={"traceparent": traceparent}))  # pass rid to the engine

rec = StepRecorder()  # what the engine does with that rid (see sdk_quickstart.py), two steps
rec.queued(rid)
rec.scheduled(rid)
rec.outputs([rid], 1)
tel.ingest(rec.end_step_bytes(37))
rec.outputs([rid], 1)
rec.finished(rid, FinishReason.STOP)
tel.ingest(rec.end_step_bytes())

with TestClient(app) as client:
    assert "vllm:e2e_request_latency_seconds_count" in client.get("/metrics").text  # text format 0.0.4
    otel = client.get("/metrics", params={"compat": "otel"}).text  # any profile from the same server
    assert "gen_ai_server_time_to_first_token_seconds_count" in otel
    openmetrics = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert openmetrics.text.endswith("# EOF\n") and 'trace_id="4bf92f3577b34da6a3ce929d0e0e4736"' in openmetrics.text
    assert client.get("/metrics", params={"compat": "nope"}).status_code == 400  # lists the profiles

stats = tel.model_statistics()  # Triton/KServe v2 statistics ($model_stat)
assert stats["inference_stats"]["success"]["count"] == 1

names = {m.name for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
assert "gen_ai.server.time_to_first_token" in names  # canonical names over OTLP

tel.shutdown()
finished = {s.name: s for s in spans.get_finished_spans()}
assert {"chat my-model", "queue", "prefill", "decode"} <= finished.keys()
assert finished["chat my-model"].parent.span_id == 0x00F067AA0BA902B7  # a child of the client's span
print(sorted(finished), stats["inference_stats"]["success"])
