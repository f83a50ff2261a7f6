"""The trace exporter: OTLP/HTTP and OTLP/gRPC to real receivers, batching, what is retried (and
when) and what is dropped, bounded queues, bad configuration."""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_llm.collector.exporter.otlp import OtlpExporter, OtlpExporterConfig
from otel_llm.collector.exporter.queue import QueueConfig, RetryConfig
from otel_llm.collector.receiver.otlp_grpc import OtlpGrpcReceiver
from otel_llm.collector.receiver.otlp_http import OtlpReceiver
from tests.harness.memory_sink import MemorySink
from tests.harness.scripted_http import ScriptedReceiver

FAST_RETRY = RetryConfig(initial_interval_s=0.01, max_interval_s=0.05, max_elapsed_time_s=3.0)


def spans_request(n: int, first: int = 0, service: str = "svc") -> bytes:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = service
    ss = rs.scope_spans.add()
    for i in range(first, first + n):
        ss.spans.add(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name=f"span {i}",
                     start_time_unix_nano=1, end_time_unix_nano=2)
    return request.SerializeToString()


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.005)


def exporter(url: str, **kwargs) -> OtlpExporter:
    kwargs.setdefault("retry", FAST_RETRY)
    return OtlpExporter(OtlpExporterConfig(url, **kwargs))


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_delivers_every_span_and_merges_what_waits(transport):
    sink = MemorySink()
    receiver = OtlpReceiver(sink) if transport == "http" else OtlpGrpcReceiver(sink)
    with receiver:
        url = f"{receiver.endpoint}/v1/traces" if transport == "http" else f"grpc://{receiver.endpoint}"
        e = exporter(url, max_batch=512)
        for i in range(5):  # queued before the sender starts: merged into one request of 500
            e.export(spans_request(100, first=100 * i), 100)
        e.export(spans_request(600, first=500), 600)  # more than a batch alone: sent alone
        e.start()
        wait_for(lambda: e.stats().sent == 1100)
        e.stop(2.0)
    names = [s.name for s in sink.received_spans()]
    assert sorted(names) == sorted(f"span {i}" for i in range(1100)) and len(set(names)) == 1100
    assert e.stats()[:4] == (1100, 0, 0, 0)
    if transport == "http":
        assert receiver.stats().accepted == 2


def test_http_retries_503_after_retry_after_and_drops_400():
    rx = ScriptedReceiver([(503, {"Retry-After": "0.3"}, b"busy"), (400, {}, b"bad span")])
    try:
        e = exporter(rx.url)
        e.start()
        started = time.monotonic()
        e.export(spans_request(3), 3)
        wait_for(lambda: e.stats().send_failed == 3)  # 503 then 400: retried once, then dropped
        assert len(rx.received) == 2 and rx.received[1].time_s - started >= 0.3
        e.export(spans_request(2), 2)
        wait_for(lambda: e.stats().sent == 2)
        assert rx.received[0].headers["Content-Type"] == "application/x-protobuf"
        assert rx.received[0].headers["User-Agent"].startswith("otel-llm/")
        e.stop(1.0)
    finally:
        rx.close()


class ScriptedGrpc:
    """A TraceService answering each Export with the next scripted (code, retry delay) or OK."""

    def __init__(self, script):
        self.script, self.calls = list(script), []
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        handler = grpc.unary_unary_rpc_method_handler(self.export, request_deserializer=None,
                                                      response_serializer=lambda m: m.SerializeToString())
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": handler}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def export(self, body: bytes, context: grpc.ServicerContext):
        self.calls.append(time.monotonic())
        if self.script:
            code, delay_s = self.script.pop(0)
            if delay_s is not None:
                info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(nanos=int(delay_s * 1e9)))
                status = status_pb2.Status(code=code.value[0], message="slow down")
                status.details.add().Pack(info)
                context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(code, "scripted")
        return ExportTraceServiceResponse()


def test_grpc_retries_what_otlp_calls_retryable_and_honours_retry_info():
    server = ScriptedGrpc([(grpc.StatusCode.UNAVAILABLE, None), (grpc.StatusCode.RESOURCE_EXHAUSTED, 0.3),
                           (grpc.StatusCode.RESOURCE_EXHAUSTED, None), (grpc.StatusCode.INVALID_ARGUMENT, None)])
    try:
        e = exporter(f"grpc://127.0.0.1:{server.port}")
        e.start()
        e.export(spans_request(4), 4)
        wait_for(lambda: e.stats().send_failed == 4)  # UNAVAILABLE, RE + RetryInfo retried; RE alone is final
        assert len(server.calls) == 3 and server.calls[2] - server.calls[1] >= 0.3
        e.export(spans_request(1), 1)
        wait_for(lambda: e.stats().send_failed == 5)  # INVALID_ARGUMENT: never retried
        assert len(server.calls) == 4
        e.export(spans_request(2), 2)
        wait_for(lambda: e.stats().sent == 2)
        e.stop(1.0)
    finally:
        server.server.stop(0)


def test_a_down_backend_bounds_the_queue_and_counts_what_it_refuses():
    e = exporter("http://127.0.0.1:9/v1/traces",
                 queue=QueueConfig(queue_size=10, max_bytes=3 * len(spans_request(50))))
    e.start()
    for _ in range(20):
        e.export(spans_request(50), 50)
    stats = e.stats()
    # at most 3 requests' bytes wait; one merged batch (<= 512 spans) may be in flight, retrying
    assert stats.queue_size <= 3 and stats.enqueue_failed >= (20 - 3 - 512 // 50) * 50
    started = time.monotonic()
    e.stop(0.5)
    assert time.monotonic() - started < 2.0
    # a send still in flight at the deadline (a loaded machine) is counted when it returns
    wait_for(lambda: (lambda s: s.sent + s.send_failed + s.enqueue_failed)(e.stats()) == 20 * 50)
    assert e.stats().sent == 0


@pytest.mark.parametrize("url, named", [
    ("jaeger:4317", "'jaeger:4317'"), ("grpc://jaeger", "'grpc://jaeger'"), ("grpc://j:4317/v1", "'grpc://j:4317/v1'"),
    ("ftp://j/v1/traces", "'ftp://j/v1/traces'"),
])
def test_bad_urls_are_named(url, named):
    with pytest.raises(ValueError, match=named):
        OtlpExporterConfig(url)


def test_endpoints():
    assert OtlpExporterConfig("http://j:4318").endpoint == "http://j:4318/v1/traces"
    assert OtlpExporterConfig("https://j/custom/path").endpoint == "https://j/custom/path"
    assert OtlpExporterConfig("grpc://j:4317").endpoint == "j:4317"
