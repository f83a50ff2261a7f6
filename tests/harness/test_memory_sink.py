import http.client
import threading

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.collector.receiver.otlp_http import OtlpReceiver, Signal
from tests.harness.memory_sink import DroppedCounts, MemorySink


def spans_request(n: int) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(n):
        scope.spans.add(name=f"s{i}", span_id=i.to_bytes(8, "big"))
    return request


def test_bounded_store_counts_drops() -> None:
    sink = MemorySink(max_records=3)
    sink(Signal.TRACES, spans_request(2).SerializeToString())
    sink(Signal.TRACES, spans_request(2).SerializeToString())
    assert [s.name for s in sink.received_spans()] == ["s0", "s1", "s0"]
    assert sink.dropped() == DroppedCounts(spans=1, metrics=0, logs=0)


def test_logs_are_flattened() -> None:
    request = ExportLogsServiceRequest()
    log = request.resource_logs.add().scope_logs.add().log_records.add()
    log.body.string_value = "hello"
    log.severity_text = "INFO"
    log.trace_id = bytes(range(16))
    sink = MemorySink()
    sink(Signal.LOGS, request.SerializeToString())
    (record,) = sink.received_logs()
    assert (record.body, record.severity_text) == ("hello", "INFO")
    assert record.trace_id == bytes(range(16)).hex()


def test_wait_for_spans_from_another_thread() -> None:
    sink = MemorySink()
    threading.Timer(0.05, sink, (Signal.TRACES, spans_request(2).SerializeToString())).start()
    assert len(sink.wait_for_spans(2, timeout_s=5)) == 2
    with pytest.raises(TimeoutError, match="3 spans"):
        sink.wait_for_spans(3, timeout_s=0.05)


def test_chunked_request_through_receiver() -> None:
    sink = MemorySink()
    body = spans_request(5).SerializeToString()
    with OtlpReceiver(sink) as rx:
        host, port = rx.endpoint.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        chunks = iter([body[:7], body[7:]])
        conn.request(
            "POST",
            "/v1/traces",
            body=chunks,
            headers={"Content-Type": "application/x-protobuf"},
            encode_chunked=True,
        )
        assert conn.getresponse().status == 200
        conn.close()
    assert len(sink.received_spans()) == 5


def test_invalid_max_records() -> None:
    with pytest.raises(ValueError, match="max_records"):
        MemorySink(max_records=0)
