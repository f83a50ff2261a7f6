"""Export accounting: every sampled span given to a CountingBatchSpanProcessor is sent,
send-failed, refused on a full queue, or still queued; metric exports count their points."""

from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from otel_llm.export.export_counts import ExportCounts, ExporterStats, exporter_families
from otel_llm.export.exposition import self_family_lines
from otel_llm.export.otlp_metrics import CountingMetricExporter
from otel_llm.export.otlp_traces import CountingBatchSpanProcessor


class GatedExporter(InMemorySpanExporter):
    """Holds each export until `gate` is set; answers `result` (or raises)."""

    def __init__(self, result=SpanExportResult.SUCCESS):
        super().__init__()
        self.gate = threading.Event()
        self.result = result

    def export(self, spans):
        self.gate.wait(10)
        if self.result is None:
            raise ConnectionError("backend gone")
        super().export(spans)
        return self.result


def wait(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def pipeline(exporter, queue: int = 8, batch: int = 4):
    counts = ExportCounts("traces")
    processor = CountingBatchSpanProcessor(exporter, counts, max_queue_size=queue, max_export_batch_size=batch,
                                           schedule_delay_millis=10_000)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider, processor, counts


def end_spans(provider, n: int) -> None:
    tracer = provider.get_tracer("t")
    for i in range(n):
        tracer.start_span(f"s{i}").end()


@pytest.mark.parametrize("result", [SpanExportResult.SUCCESS, SpanExportResult.FAILURE, None])
def test_every_span_is_accounted_for(result):
    exporter = GatedExporter(result)
    provider, processor, counts = pipeline(exporter)
    end_spans(provider, 4)  # a full batch wakes the worker, which holds it in export
    assert wait(lambda: counts.stats().queue_size == 0)
    end_spans(provider, 30)  # 8 fit in the queue, 22 are refused
    assert counts.stats() == ExporterStats(0, 0, 22, 8, 8)
    exporter.gate.set()
    processor.force_flush()
    sent, failed = (12, 0) if result is SpanExportResult.SUCCESS else (0, 12)
    assert counts.stats() == ExporterStats(sent, failed, 22, 0, 8)
    assert len(exporter.get_finished_spans()) == (12 if result is not None else 0)
    provider.shutdown()
    end_spans(provider, 3)  # after shutdown the SDK would drop them: counted
    assert counts.stats().enqueue_failed == 25


def test_unsampled_spans_are_not_counted():
    exporter = GatedExporter()
    counts = ExportCounts("traces")
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(CountingBatchSpanProcessor(exporter, counts, max_queue_size=2,
                                                           max_export_batch_size=2))
    end_spans(provider, 5)
    provider.shutdown()
    assert counts.stats() == ExporterStats(0, 0, 0, 0, 2)


@pytest.mark.parametrize("result", [MetricExportResult.SUCCESS, MetricExportResult.FAILURE])
def test_metric_points_are_counted(result):
    class Exporter:
        _preferred_temporality = _preferred_aggregation = None

        def export(self, metrics_data, timeout_millis=10_000, **kwargs):
            return result

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("m")
    meter.create_counter("c").add(1, {"k": "a"})
    meter.create_counter("c").add(1, {"k": "b"})
    meter.create_histogram("h").record(1.0)
    counts = ExportCounts("metrics")
    CountingMetricExporter(Exporter(), counts).export(reader.get_metrics_data())
    ok = result is MetricExportResult.SUCCESS
    assert counts.stats() == ExporterStats(3 if ok else 0, 0 if ok else 3, 0, 0, 0)


def test_families_are_named_like_the_collectors():
    spans, points = ExportCounts("traces"), ExportCounts("metrics")
    spans.add(sent=5, enqueue_failed=2)
    spans.watch_queue(lambda: 3, 8192)
    points.add(send_failed=7)
    lines: list[str] = []
    self_family_lines(lines, exporter_families([spans, points]), openmetrics=False)
    samples = [line for line in lines if not line.startswith("#")]
    labels = '{exporter="otlp",data_type="%s"}'
    assert samples == [
        "otel_llm_exporter_sent_metric_points_total" + labels % "metrics" + " 0.0",
        "otel_llm_exporter_send_failed_metric_points_total" + labels % "metrics" + " 7.0",
        "otel_llm_exporter_enqueue_failed_metric_points_total" + labels % "metrics" + " 0.0",
        "otel_llm_exporter_sent_spans_total" + labels % "traces" + " 5.0",
        "otel_llm_exporter_send_failed_spans_total" + labels % "traces" + " 0.0",
        "otel_llm_exporter_enqueue_failed_spans_total" + labels % "traces" + " 2.0",
        "otel_llm_exporter_queue_size" + labels % "traces" + " 3.0",  # the reader has no queue
        "otel_llm_exporter_queue_capacity" + labels % "traces" + " 8192.0",
    ]
    assert exporter_families([]) == []
