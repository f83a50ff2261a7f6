"""`stop_retries`: an SDK OTLP exporter whose export fails is not retried once it is called (the
last export at shutdown is one attempt), through the counting reader and span processor too."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.export.export_counts import ExportCounts
from otel_llm.export.final_export import stop_retries
from otel_llm.export.otlp_metrics import otlp_metric_reader
from otel_llm.export.otlp_traces import CountingBatchSpanProcessor
from tests.harness.scripted_http import ScriptedReceiver


class _Unavailable(ScriptedReceiver):
    """An OTLP/HTTP endpoint that answers every POST 503 (retryable), counting them."""

    def __init__(self):
        super().__init__([(503, {}, b"")] * 100)

    @property
    def posts(self) -> int:
        return len(self.received)

    def at(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"


@pytest.fixture
def endpoint():
    server = _Unavailable()
    yield server
    server.close()


def _spans(count: int) -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(count):
        provider.get_tracer("t").start_span(f"s{i}").end()
    return list(memory.get_finished_spans())


def test_a_failed_export_is_not_retried_after_stop_retries(endpoint):
    exporter = OTLPSpanExporter(endpoint=endpoint.at("/v1/traces"))
    assert stop_retries(exporter)
    assert exporter.export(_spans(2)) is SpanExportResult.FAILURE
    assert endpoint.posts == 1  # one attempt: without stop_retries a 503 is retried after 1, 2, 4 s


def test_the_grpc_exporters_signal_is_found_too():
    assert stop_retries(GrpcSpanExporter(endpoint="127.0.0.1:1", insecure=True))
    assert not stop_retries(object())


def test_the_span_processors_last_batches_are_tried_once(endpoint):
    counts = ExportCounts("traces")
    processor = CountingBatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint.at("/v1/traces")), counts,
                                           schedule_delay_millis=600_000, max_export_batch_size=2)
    for span in _spans(5):
        processor.on_end(span)
    processor.shutdown()
    assert endpoint.posts == 3  # 3 batches, each once
    assert counts.stats().send_failed == 5


def test_the_metric_readers_last_export_is_tried_once(endpoint, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    counts = ExportCounts("metrics")
    reader = otlp_metric_reader(endpoint.at(""), interval_s=600, counts=counts)
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("m").create_counter("c").add(1)
    provider.shutdown()
    assert endpoint.posts == 1
    assert counts.stats().send_failed == 1
