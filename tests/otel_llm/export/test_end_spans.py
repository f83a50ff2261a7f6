"""`end_spans`: finished spans reach every span processor as their `on_end` one by one would
deliver them: a BatchSpanProcessor takes the list in one call, and wherever that could differ
(no room, shut down, another processor) each span goes through `on_end`."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.export.export_counts import ExportCounts
from otel_llm.export.otlp_traces import CountingBatchSpanProcessor, end_spans
from otel_llm.export.finished_spans import FinishedSpan
from otel_llm.frontend.request_spans import sampled_context


def spans(n: int, first: int = 1) -> list[FinishedSpan]:
    return [FinishedSpan(f"s{i}", sampled_context(7, i), None, None, {}, i, i + 1) for i in range(first, first + n)]


def provider_with(processor) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider


def batch(queue: int = 64, size: int = 4, delay_ms: int = 60_000):
    exporter = InMemorySpanExporter()
    return BatchSpanProcessor(exporter, max_queue_size=queue, max_export_batch_size=size,
                              schedule_delay_millis=delay_ms), exporter


def names(exporter) -> list[str]:
    return [s.name for s in exporter.get_finished_spans()]


def per_span(queue: int, given: list[list[FinishedSpan]]) -> list[str]:
    """What the SDK's own on_end, span by span, exports of the same lists."""
    processor, exporter = batch(queue)
    provider = provider_with(processor)
    with processor._batch_processor._export_lock:  # the SDK's worker takes nothing meanwhile
        for group in given:
            for span in group:
                processor.on_end(span)
    provider.force_flush()
    provider.shutdown()
    return names(exporter)


def test_a_batch_processor_takes_the_list_in_one_call_in_on_ends_order(monkeypatch):
    processor, exporter = batch()
    provider = provider_with(processor)
    given = [spans(5), spans(3, 10)]
    with monkeypatch.context() as m:
        m.setattr(BatchSpanProcessor, "on_end", lambda self, span: pytest.fail("on_end called"))
        for group in given:
            end_spans(provider._active_span_processor, group)
    provider.force_flush()
    assert names(exporter) == per_span(64, given) == [f"s{i}" for i in (1, 2, 3, 4, 5, 10, 11, 12)]
    provider.shutdown()


def test_without_room_for_all_each_span_goes_through_on_end_and_the_sdk_drops_as_it_does():
    processor, exporter = batch(queue=4)
    provider = provider_with(processor)
    given = [spans(3), spans(3, 10)]
    with processor._batch_processor._export_lock:  # the SDK's worker (woken at 4) takes nothing meanwhile
        for group in given:
            end_spans(provider._active_span_processor, group)
    provider.force_flush()
    assert names(exporter) == per_span(4, given)
    assert len(names(exporter)) == 4  # the queue's size: the oldest were dropped
    provider.shutdown()


def test_a_full_batch_wakes_the_worker():
    processor, exporter = batch()
    provider = provider_with(processor)
    end_spans(provider._active_span_processor, spans(4))
    deadline = time.monotonic() + 10
    while len(names(exporter)) < 4 and time.monotonic() < deadline:  # no flush: the worker's schedule is 60 s
        time.sleep(0.01)
    assert names(exporter) == ["s1", "s2", "s3", "s4"]
    provider.shutdown()


def test_after_shutdown_spans_are_refused_as_on_end_refuses_them():
    processor, exporter = batch()
    provider = provider_with(processor)
    provider.shutdown()
    end_spans(provider._active_span_processor, spans(3))
    processor.force_flush()
    assert names(exporter) == []


def test_the_counting_processor_counts_what_finds_no_room():
    counts = ExportCounts("traces")
    exporter = InMemorySpanExporter()
    processor = CountingBatchSpanProcessor(exporter, counts, max_queue_size=8, max_export_batch_size=8,
                                           schedule_delay_millis=60_000)
    provider = provider_with(processor)
    with processor._batch_processor._export_lock:  # the SDK's worker (woken at 8) takes nothing meanwhile
        end_spans(provider._active_span_processor, spans(6))  # room: one call
        end_spans(provider._active_span_processor, spans(4, 10))  # 2 fit, 2 refused and counted
    stats = counts.stats()
    assert (stats.enqueue_failed, stats.queue_size) == (2, 8)
    provider.force_flush()
    assert names(exporter) == [f"s{i}" for i in (1, 2, 3, 4, 5, 6, 10, 11)]
    assert counts.stats().sent == 8
    provider.shutdown()
    end_spans(provider._active_span_processor, spans(2, 20))
    assert counts.stats().enqueue_failed == 4


def test_every_processor_gets_every_span():
    processor, batched = batch()
    simple = InMemorySpanExporter()
    provider = provider_with(processor)
    provider.add_span_processor(SimpleSpanProcessor(simple))
    end_spans(provider._active_span_processor, spans(3))
    provider.force_flush()
    assert names(batched) == names(simple) == ["s1", "s2", "s3"]
    provider.shutdown()
