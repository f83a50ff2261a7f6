"""Phase spans for vLLM's latency-only `llm_request` spans: derived queue/prefill/decode children and a
first_token event, from the real spans vLLM 0.32 sent (shared/reference/vllm-0.32-cpu); the originals
untouched; unusable latencies skipped and counted; through the collector into the trace store and
Jaeger's API, with tail sampling too, and off with --no-phase-spans."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.collector.processor.phase_spans import SCOPE, VLLM, PhaseSpans
from otel_llm.collector.processor.tail_sampling import TailSamplingConfig
from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.collector.tracestore.store import TraceStoreConfig
from tests.collector.otlp_builders import kvs
from tests.server.api.api_server_harness import wait_until

SPANS = Path(__file__).parents[1] / "data/vllm_llm_request_spans.json"  # as vLLM 0.32 sent them (shared/reference)
LATENCIES = ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_model_prefill",
             "gen_ai.latency.time_in_model_decode")


def vllm_spans() -> list[dict]:
    return json.loads(SPANS.read_text())


def vllm_request(spans: list[dict] | None = None, attrs: dict | None = None) -> ExportTraceServiceRequest:
    spans = vllm_spans() if spans is None else spans
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(kvs(spans[0]["resource"]))
    ss = rs.scope_spans.add()
    ss.scope.name = "vllm.tracing.otel"
    for s in spans:
        span = ss.spans.add(trace_id=bytes.fromhex(s["trace_id"]), span_id=bytes.fromhex(s["span_id"]),
                            parent_span_id=bytes.fromhex(s["parent_span_id"]), name="llm_request",
                            kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=s["start_time_unix_nano"],
                            end_time_unix_nano=s["end_time_unix_nano"], flags=0x301)
        span.attributes.extend(kvs({**s["attributes"], **(attrs or {})}))
    return request


def attr(span: Span, key: str):
    kv = next(kv for kv in span.attributes if kv.key == key)
    return getattr(kv.value, kv.value.WhichOneof("value"))


def test_each_vllm_request_span_gets_exact_phases_and_the_original_is_untouched():
    request = vllm_request()
    original = request.resource_spans[0].SerializeToString()
    phases = PhaseSpans()
    out = ExportTraceServiceRequest.FromString(phases.process(request.SerializeToString()))
    rs = out.resource_spans[0]
    assert rs.scope_spans[0].SerializeToString() == request.resource_spans[0].scope_spans[0].SerializeToString()
    assert rs.resource == request.resource_spans[0].resource and len(original) > 0
    derived_scope = rs.scope_spans[1]
    assert derived_scope.scope == SCOPE and len(rs.scope_spans) == 2
    assert phases.derived == len(request.resource_spans[0].scope_spans[0].spans) == 3 and phases.skipped == 0
    for parent in rs.scope_spans[0].spans:
        kids = {s.name: s for s in derived_scope.spans if s.parent_span_id == parent.span_id}
        assert list(kids) == ["queue", "prefill", "decode"]
        first = parent.start_time_unix_nano + round(attr(parent, "gen_ai.latency.time_to_first_token") * 1e9)
        for (name, span), key in zip(kids.items(), LATENCIES):
            assert span.trace_id == parent.trace_id and span.kind == Span.SPAN_KIND_INTERNAL
            assert abs((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9 - attr(parent, key)) < 1e-6
            assert attr(span, "otel_llm.derived") is True and attr(span, "otel_llm.derived_from") == key
            assert span.flags == 0x01  # the parent's W3C flags (sampled)
        assert kids["queue"].end_time_unix_nano == kids["prefill"].start_time_unix_nano
        assert kids["prefill"].end_time_unix_nano == kids["decode"].start_time_unix_nano == first
        assert [(e.name, e.time_unix_nano) for e in kids["prefill"].events] == [("first_token", first)]
        assert parent.start_time_unix_nano <= kids["queue"].start_time_unix_nano  # the API server's share first
        assert abs(kids["decode"].end_time_unix_nano - parent.end_time_unix_nano) < 5e6  # two clocks, close
    again = ExportTraceServiceRequest.FromString(PhaseSpans().process(request.SerializeToString()))
    assert [s.span_id for s in again.resource_spans[0].scope_spans[1].spans] == [s.span_id for s in derived_scope.spans]
    assert len({s.span_id for s in derived_scope.spans}) == 9  # stable and distinct


def test_requests_without_a_known_request_span_pass_as_the_same_bytes():
    ours = vllm_request()
    ours.resource_spans[0].scope_spans[0].scope.name = "otel_llm"  # our spans have their children already
    payload = ours.SerializeToString()
    phases = PhaseSpans()
    assert phases.process(payload) is payload
    other_name = vllm_request()
    other_name.resource_spans[0].scope_spans[0].spans[0].name = "Overall Loading"  # vLLM's start-up spans
    out = ExportTraceServiceRequest.FromString(phases.process(other_name.SerializeToString()))
    assert sum(len(ss.spans) for ss in out.resource_spans[0].scope_spans) == 3 + 6
    assert phases.derived == 2 and phases.skipped == 0


@pytest.mark.parametrize("bad", [{"gen_ai.latency.time_in_queue": -0.001}, {"gen_ai.latency.time_in_model_decode": math.nan},
                                 {"gen_ai.latency.time_to_first_token": "fast"},
                                 {"gen_ai.latency.time_in_model_prefill": math.inf},
                                 {"gen_ai.latency.time_in_queue": 1e12}])  # would start before 1970
def test_unusable_latencies_are_skipped_and_counted_and_the_span_still_passes(bad):
    request = vllm_request(attrs=bad)
    phases = PhaseSpans()
    payload = request.SerializeToString()
    assert phases.process(payload) is payload
    assert (phases.derived, phases.skipped) == (0, 3)


def test_a_missing_latency_is_skipped_and_int_seconds_are_taken():
    spans = vllm_spans()[:2]
    del spans[0]["attributes"]["gen_ai.latency.time_in_model_decode"]
    spans[1]["attributes"]["gen_ai.latency.time_in_queue"] = 0  # an int value
    phases = PhaseSpans()
    out = ExportTraceServiceRequest.FromString(phases.process(vllm_request(spans).SerializeToString()))
    assert (phases.derived, phases.skipped) == (1, 1)
    queue = next(s for s in out.resource_spans[0].scope_spans[1].spans if s.name == "queue")
    assert queue.start_time_unix_nano == queue.end_time_unix_nano


def test_a_malformed_request_naming_a_known_scope_raises():
    with pytest.raises(DecodeError):
        PhaseSpans().process(b"\x0a\xff\xff\xff" + VLLM.scope.encode())


@pytest.mark.parametrize("sampling", [False, True], ids=["every trace", "tail sampling"])
def test_through_the_collector_into_the_trace_store_and_jaegers_api(tmp_path, sampling):
    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=None, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(tmp_path / "traces")),
                             tail_sampling=TailSamplingConfig(keep_fraction=1.0, decision_wait_s=0.1) if sampling
                             else None)
    spans = vllm_spans()
    with Collector(config) as collector:
        answer = httpx.post(f"{collector.http.endpoint}/v1/traces", content=vllm_request(spans).SerializeToString(),
                            headers={"Content-Type": "application/x-protobuf"})
        assert answer.status_code == 200
        api = collector.jaeger.url
        trace_id = spans[0]["trace_id"]

        def trace():
            data = httpx.get(f"{api}/api/traces/{trace_id}").json()["data"]
            return data[0] if data and len(data[0]["spans"]) == 4 else None
        assert wait_until(trace, timeout_s=10)
        got = trace()
        by_name = {s["operationName"]: s for s in got["spans"]}
        root = by_name["llm_request"]
        for name, key in zip(("queue", "prefill", "decode"), LATENCIES):
            span = by_name[name]
            assert span["references"] == [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": root["spanID"]}]
            assert abs(span["duration"] / 1e6 - spans[0]["attributes"][key]) <= 1e-6  # Jaeger's µs
            assert {"key": "otel_llm.derived", "type": "bool", "value": True} in span["tags"]
        ttft_us = spans[0]["attributes"]["gen_ai.latency.time_to_first_token"] * 1e6
        [log] = by_name["prefill"]["logs"]
        assert log["fields"] == [{"key": "event", "type": "string", "value": "first_token"}]
        assert abs(log["timestamp"] - root["startTime"] - ttft_us) <= 1
        assert 'otel_llm_phase_spans_requests_total{outcome="derived"} 3' in collector.render().decode()


def test_no_phase_spans_passes_them_as_they_come(tmp_path):
    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=None, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(tmp_path / "traces")), phase_spans=False)
    spans = vllm_spans()
    with Collector(config) as collector:
        httpx.post(f"{collector.http.endpoint}/v1/traces", content=vllm_request(spans).SerializeToString(),
                   headers={"Content-Type": "application/x-protobuf"}).raise_for_status()
        url = f"{collector.jaeger.url}/api/traces/{spans[0]['trace_id']}"
        assert wait_until(lambda: httpx.get(url).json()["data"], timeout_s=10)
        assert [s["operationName"] for s in httpx.get(url).json()["data"][0]["spans"]] == ["llm_request"]
        assert "otel_llm_phase_spans" not in collector.render().decode()
