"""The request timeline model: one row per request span with its phase spans' exact times, the
first-token and preemption marks, the finish reason; vLLM's `llm_request` spans through their
derived phases; the step-level load; the row filter."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.collector.processor.phase_spans import PhaseSpans
from otel_llm.collector.timeline.rows import LoadPoint, RowFilter, TimelineRow, load, rows_from_traces
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
from tests.collector.processor.test_phase_spans import vllm_request
from tests.collector.tracestore.test_store import T0_NS, add, llm_spans, request, tid


@pytest.fixture
def store(tmp_path):
    s = TraceStore(TraceStoreConfig(str(tmp_path / "traces")))
    yield s
    s.close()


def rows(store: TraceStore) -> list[TimelineRow]:
    return rows_from_traces(store.request_traces(0, 1 << 62, 1000))


def test_a_row_is_the_request_span_and_its_phase_spans_to_the_ns(store):
    spans = llm_spans(1, T0_NS + 7, ttft_s=0.05, e2e_s=0.5, queue_s=0.01, model="m1")
    spans[1].events.add(name="preempted", time_unix_nano=T0_NS + 300_000_123)
    spans[1].events.add(name="preempted", time_unix_nano=T0_NS + 200_000_001)
    add(store, request(spans, **{"service.instance.id": "gpu-3"}))
    add(store, request(llm_spans(2, T0_NS + 10**9, error="abort", ttft_s=0.2)))
    first, second = rows(store)
    request_span, queue, prefill, decode = spans[1], *spans[2:]
    assert first == TimelineRow(
        tid(1).hex(), request_span.span_id.hex(), "llm", "gpu-3", "m1", "chat m1",
        request_span.start_time_unix_nano, request_span.end_time_unix_nano,
        *((s.start_time_unix_nano, s.end_time_unix_nano) for s in (queue, prefill, decode)),
        request_span.events[0].time_unix_nano,
        (T0_NS + 200_000_001, T0_NS + 300_000_123), "stop", 0.05, 0.5)
    assert (second.trace_id, second.finish_reason, second.ttft_s, second.instance) == (tid(2).hex(), "abort", 0.2, "")


def test_as_json_keeps_every_ns(store):
    add(store, request(llm_spans(1, T0_NS + 123_456_789)))
    (row,) = rows(store)
    doc = row.as_json()
    assert doc["start_ns"] == str(row.start_ns) and int(doc["start_ns"]) > 1 << 53  # beyond a double's integers
    assert doc["queue"] == [str(t) for t in row.queue] and doc["first_token_ns"] == str(row.first_token_ns)
    assert doc["preemptions_ns"] == [] and doc["trace_id"] == tid(1).hex() and doc["ttft_s"] == 0.05
    assert LoadPoint(T0_NS + 1, 2, 3).as_json() == {"t_ns": str(T0_NS + 1), "waiting": 2, "running": 3}


def test_a_request_without_phases_is_a_row_without_segments(store):
    spans = llm_spans(1, T0_NS, error="abort")[:2]  # aborted while queued: no queue/prefill/decode spans
    del spans[1].events[:]
    add(store, request(spans))
    (row,) = rows(store)
    assert (row.queue, row.prefill, row.decode, row.first_token_ns) == (None, None, None, None)
    assert row.finish_reason == "abort"
    assert load([row]) == []


def test_vllm_request_spans_get_their_derived_phases(store):
    payload = PhaseSpans().process(vllm_request().SerializeToString())
    store.add(payload)
    got = rows(store)
    spans = [span for rs in ExportTraceServiceRequest.FromString(payload).resource_spans
             for ss in rs.scope_spans for span in ss.spans]
    derived = {(span.parent_span_id.hex(), span.name): span for span in spans if span.name != "llm_request"}
    assert len(got) == len(spans) - len(derived) == 3
    for row in got:
        assert row.name == "llm_request" and row.service == "unknown_service:python" and row.model == ""
        assert row.instance == "0acf409f-4685-4cbb-805e-56b0d654b4b8"
        phases = {name: derived[row.span_id, name] for name in ("queue", "prefill", "decode")}
        for name, span in phases.items():
            assert getattr(row, name) == (span.start_time_unix_nano, span.end_time_unix_nano)
        assert row.first_token_ns == phases["prefill"].events[0].time_unix_nano == row.prefill[1]
        assert row.preemptions_ns == () and row.ttft_s > 0 and row.e2e_s > 0


def test_load_counts_waiting_and_running_between_boundaries():
    def row(queue, prefill, decode):
        return TimelineRow("t", "s", "svc", "", "m", "chat m", 0, 100, queue, prefill, decode, None, (), "stop", 0.1,
                           0.2)
    rows = [row((0, 10), (10, 20), (20, 50)), row((5, 30), (30, 40), (40, 40)), row(None, None, None)]
    assert load(rows) == [LoadPoint(0, 1, 0), LoadPoint(5, 2, 0), LoadPoint(10, 1, 1), LoadPoint(20, 1, 1),
                          LoadPoint(30, 0, 2),
                          LoadPoint(40, 0, 1), LoadPoint(50, 0, 0)]  # a zero-length decode counts for nothing
    assert load([]) == []


def test_row_filter():
    base = TimelineRow("t", "s", "svc", "i-1", "m", "chat m", 0, 1, None, None, None, None, (), "abort", 0.5, 2.0)
    assert RowFilter().matches(base)
    assert RowFilter(model="m", instance="i-1", finish_reason="abort", ttft_above_s=0.4, e2e_above_s=1.9).matches(base)
    for wanted in (RowFilter(model="x"), RowFilter(instance="i-2"), RowFilter(finish_reason="stop"),
                   RowFilter(ttft_above_s=0.5), RowFilter(e2e_above_s=2.0)):  # thresholds are exclusive
        assert not wanted.matches(base), wanted
    assert not RowFilter(ttft_above_s=0).matches(base._replace(ttft_s=None))  # no first token: no TTFT to compare
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ttft_above_s"):
            RowFilter(ttft_above_s=bad)
