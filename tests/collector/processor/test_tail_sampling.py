"""LLM-aware tail sampling on hand-built traces: what is kept and why, waiting for the root, late
spans, bounds, the kept fraction, and the pipeline through a real collector."""

from __future__ import annotations

import math
import random

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status as SdkStatus
from opentelemetry.trace import StatusCode

from otel_llm.collector.pdata.otlp_codec import PayloadError
from otel_llm.collector.processor.tail_sampling import TailSamplingConfig
from otel_llm.collector.receiver.otlp_http import OtlpReceiver
from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.collector.trace_pipeline import TracePipeline
from tests.collector.otlp_builders import samples
from tests.harness.memory_sink import MemorySink
from tests.server.api.api_server_harness import wait_until

DROP_ALL_FINE = TailSamplingConfig(keep_fraction=0.0)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Recorder:
    """Stands in for the exporters: what the pipeline sends on."""

    def __init__(self):
        self.requests: list[ExportTraceServiceRequest] = []

    def export(self, payload: bytes, spans: int) -> None:
        request = ExportTraceServiceRequest.FromString(payload)
        assert spans == sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        self.requests.append(request)

    def spans(self) -> list[tuple[str, str]]:
        """(service, span name) of everything sent on."""
        return [(rs.resource.attributes[0].value.string_value, s.name)
                for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


def trace_id(n: int, keep_bits: int = 2**63) -> bytes:
    """A trace id whose lower 64 bits are `keep_bits` (2**63: outside any keep fraction below 0.5)."""
    return n.to_bytes(8, "big") + keep_bits.to_bytes(8, "big")


def request(tid: bytes, *, root: bool = True, children: bool = True, service: str = "svc", error_type: str = "",
            status_error: bool = False, preempted: bool = False, **latency: float) -> bytes:
    """One otel-llm request trace (or part of it): the gen_ai span (root) and its children."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = service
    ss = rs.scope_spans.add()
    ss.scope.name = "otel_llm"
    root_id = b"\xff" + tid[1:8]  # never all zero, as OTLP requires
    if children:
        for i, name in enumerate(("queue", "prefill", "decode")):
            ss.spans.add(trace_id=tid, span_id=bytes([i + 1]) * 8, parent_span_id=root_id, name=name)
    if root:
        span = ss.spans.add(trace_id=tid, span_id=root_id, name="chat m")
        for key, value in latency.items():
            span.attributes.add(key={"ttft": "gen_ai.latency.time_to_first_token", "e2e": "gen_ai.latency.e2e",
                                     "queue": "gen_ai.latency.time_in_queue"}[key]).value.double_value = value
        if error_type:
            span.attributes.add(key="error.type").value.string_value = error_type
        if status_error:
            span.status.code = Status.STATUS_CODE_ERROR
        if preempted:
            span.events.add(name="preempted", time_unix_nano=5)
    return req.SerializeToString()


def pipeline(config: TailSamplingConfig = DROP_ALL_FINE, clock=None) -> tuple[TracePipeline, Recorder]:
    recorder = Recorder()
    p = TracePipeline([recorder], config)
    if clock is not None:
        p.sampler._clock = clock
    return p, recorder


def test_keeps_failed_aborted_preempted_and_slow_requests_and_drops_fast_fine_ones():
    p, out = pipeline()
    cases = {
        "fine": {"ttft": 0.1, "e2e": 1.0, "queue": 0.01},
        "aborted": {"error_type": "abort", "ttft": 0.1},
        "failed": {"status_error": True},
        "preempted": {"preempted": True, "ttft": 0.2},
        "slow_ttft": {"ttft": 2.5},
        "slow_e2e": {"e2e": 61.0},
        "slow_queue": {"queue": 6.0, "ttft": 0.3},
    }
    for i, (service, kwargs) in enumerate(cases.items()):
        assert p.consume(request(trace_id(i), service=service, **kwargs)) == (4, 0, "")  # accepted, refused, reason
    kept = out.spans()
    assert sorted({service for service, _ in kept}) == sorted(set(cases) - {"fine"})
    assert len(kept) == 4 * (len(cases) - 1)  # whole traces: the root and its three children
    stats = p.sampler.stats()
    assert stats.traces == {("kept", "abort"): 1, ("kept", "error"): 1, ("kept", "preempted"): 1,
                            ("kept", "slow_ttft"): 1, ("kept", "slow_e2e"): 1, ("kept", "slow_queue"): 1,
                            ("dropped", "not_sampled"): 1}
    assert stats.spans == {"kept": 24, "dropped": 4} and stats.pending_traces == 0
    families = {f.name: f for f in p.families()}
    assert ('decision="kept",reason="abort"', 1) in families["otel_llm_tail_sampling_traces"].samples


def test_waits_for_the_root_then_late_spans_follow_the_decision():
    clock = Clock()
    p, out = pipeline(TailSamplingConfig(keep_fraction=0.0, decision_wait_s=10), clock)
    p.consume(request(trace_id(1), root=False))  # children first, as a batch span processor sends them
    assert out.spans() == [] and p.sampler.stats().pending_traces == 1
    p.consume(request(trace_id(1), children=False, ttft=3.0))  # the root: slow, so kept, with its children
    assert sorted(name for _, name in out.spans()) == ["chat m", "decode", "prefill", "queue"]
    p.consume(request(trace_id(1), root=False))  # late spans of a kept trace go straight out
    assert len(out.spans()) == 7
    p.consume(request(trace_id(2), children=False, ttft=0.1))  # dropped...
    p.consume(request(trace_id(2), root=False))  # ...and so are its late children
    assert len(out.spans()) == 7 and p.sampler.stats().spans == {"kept": 7, "dropped": 4}


def test_a_trace_without_root_is_decided_after_the_wait_and_everything_at_flush():
    clock = Clock()
    p, out = pipeline(TailSamplingConfig(keep_fraction=0.0, decision_wait_s=10), clock)
    p.consume(request(trace_id(1), root=False, service="rootless"))
    clock.t += 5
    p.consume(request(trace_id(2), root=False, service="young"))
    p.tick()
    assert p.sampler.stats().pending_traces == 2
    clock.t += 6  # the first waited 11 s: decided (no reason to keep), the second stays
    p.tick()
    stats = p.sampler.stats()
    assert stats.pending_traces == 1 and stats.traces == {("dropped", "not_sampled"): 1}
    p.flush()
    assert p.sampler.stats().pending_traces == 0 and out.spans() == []


def test_pending_traces_and_spans_are_bounded():
    p, out = pipeline(TailSamplingConfig(keep_fraction=0.0, ttft_above_s=0.0, max_traces=10, max_spans=25))
    for i in range(30):  # children only: no root ever comes
        p.consume(request(trace_id(i), root=False))
        stats = p.sampler.stats()
        assert stats.pending_traces <= 10 and stats.pending_spans <= 25
    assert p.sampler.stats().traces[("dropped", "not_sampled")] >= 20


def test_kept_fraction_is_within_statistical_bounds():
    p, out = pipeline(TailSamplingConfig(keep_fraction=0.1))
    rng = random.Random(7)
    n = 20_000
    for i in range(n):
        p.consume(request(rng.randbytes(16), children=False, ttft=0.1))
    kept = p.sampler.stats().traces.get(("kept", "sampled"), 0)
    sigma = math.sqrt(n * 0.1 * 0.9)
    assert abs(kept - 0.1 * n) < 4 * sigma, kept
    # the same trace ids always get the same decision (collectors agree)
    p2, _ = pipeline(TailSamplingConfig(keep_fraction=0.1))
    rng = random.Random(7)
    for i in range(n):
        p2.consume(request(rng.randbytes(16), children=False, ttft=0.1))
    assert p2.sampler.stats().traces == p.sampler.stats().traces


def test_malformed_spans_are_refused_whole():
    p, out = pipeline()
    good = ExportTraceServiceRequest.FromString(request(trace_id(1)))
    good.resource_spans[0].scope_spans[0].spans[0].name = "x"
    raw = bytearray(good.SerializeToString())
    with pytest.raises(PayloadError, match="malformed protobuf"):
        p.consume(bytes(raw[:-3]))
    assert p.sampler.stats().pending_traces == 0 and out.spans() == []


@pytest.mark.parametrize("bad", [{"keep_fraction": 1.5}, {"ttft_above_s": -1}, {"max_traces": 0}])
def test_bad_config_is_named(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        TailSamplingConfig(**bad)


def test_through_a_collector_from_the_sdk():
    sink = MemorySink()
    sampling = TailSamplingConfig(keep_fraction=0.0, ttft_above_s=1.0)
    with OtlpReceiver(sink) as backend, Collector(CollectorConfig(
            otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, traces_to=(f"{backend.endpoint}/v1/traces",),
            tail_sampling=sampling)) as collector:
        provider = TracerProvider(resource=Resource.create({"service.name": "app"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{collector.http.endpoint}/v1/traces")))
        tracer = provider.get_tracer("t")
        for i, (ttft, failed) in enumerate([(0.1, False), (1.5, False), (0.2, True), (0.3, False)]):
            with tracer.start_as_current_span(f"chat {i}") as root:
                with tracer.start_as_current_span("decode"):
                    pass
                root.set_attribute("gen_ai.latency.time_to_first_token", ttft)
                if failed:
                    root.set_status(SdkStatus(StatusCode.ERROR, "boom"))
        provider.shutdown()
        assert wait_until(lambda: len(sink.received_spans()) == 4, timeout_s=10)
        own = samples(collector.render().decode())
    assert sorted(s.name for s in sink.received_spans()) == ["chat 1", "chat 2", "decode", "decode"]
    assert own['otel_llm_tail_sampling_traces_total{decision="kept",reason="slow_ttft"}'] == 1
    assert own['otel_llm_tail_sampling_traces_total{decision="kept",reason="error"}'] == 1
    assert own['otel_llm_tail_sampling_traces_total{decision="dropped",reason="not_sampled"}'] == 2
    assert own['otelcol_receiver_accepted_spans_total{receiver="otlp",transport="http"}'] == 8


def _timed(payload: bytes, start_s: float, end_s: float) -> bytes:
    """`payload` with every span from start_s to end_s (epoch seconds)."""
    req = ExportTraceServiceRequest.FromString(payload)
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.start_time_unix_nano, span.end_time_unix_nano = int(start_s * 1e9), int(end_s * 1e9)
    return req.SerializeToString()


def lane_window(n: int, start_s: float, end_s: float, service: str = "svc") -> bytes:
    """One engine lane window span (`otel_llm.export.lane_spans`), a trace of its own."""
    from otel_llm.export.lane_spans import LANE_SPAN

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = service
    ss = rs.scope_spans.add()
    ss.scope.name = "otel_llm"
    span = ss.spans.add(trace_id=trace_id(1000 + n), span_id=b"\x07" * 8, name=LANE_SPAN)
    span.attributes.add(key="otel_llm.lane.steps").value.int_value = 3
    return _timed(req.SerializeToString(), start_s, end_s)


def test_lane_windows_are_kept_where_a_kept_request_of_their_process_ran():
    """Windows wait `lane_wait_s` for the requests that ran in them, then go with them: the two that a
    kept (slow) request overlaps are kept, one only a dropped request touched and one of another
    process are dropped; a window that came after its request was decided is still matched."""
    clock = Clock()
    p, out = pipeline(TailSamplingConfig(keep_fraction=0.0, lane_wait_s=30), clock)
    p.consume(lane_window(1, 0.0, 1.0))
    p.consume(_timed(request(trace_id(1), ttft=0.1), 0.2, 0.8))  # fine: dropped
    p.consume(lane_window(2, 1.0, 2.0))
    p.consume(_timed(request(trace_id(2), ttft=3.0), 1.5, 2.5))  # slow: kept, decided at once
    p.consume(lane_window(3, 2.0, 3.0))  # after its request's decision
    p.consume(lane_window(4, 1.6, 2.4, service="other"))  # the same time, another process
    assert sorted(name for _, name in out.spans()) == ["chat m", "decode", "prefill", "queue"]
    assert p.sampler.stats().pending_spans == 4  # the windows wait
    clock.t += 29
    p.tick()
    assert p.sampler.stats().pending_spans == 4
    clock.t += 2
    p.tick()
    windows = [(service, name) for service, name in out.spans() if name == "engine steps"]
    assert windows == [("svc", "engine steps")] * 2
    stats = p.sampler.stats()
    assert stats.traces[("kept", "lane_overlap")] == 2 and stats.traces[("dropped", "lane_no_overlap")] == 2
    assert stats.pending_spans == 0


def test_lane_windows_are_bounded_and_decided_at_flush():
    p, out = pipeline(TailSamplingConfig(keep_fraction=0.0, max_spans=5))
    for n in range(12):
        p.consume(lane_window(n, n, n + 1))
        assert p.sampler.stats().pending_spans <= 5
    p.flush()
    assert p.sampler.stats().pending_spans == 0 and p.sampler.stats().traces[("dropped", "lane_no_overlap")] == 12


def test_the_vllm_plugins_lane_goes_with_vllms_request_spans_through_vllms_tracer():
    """vLLM's tracer provider (its resource: no service.instance.id, its pid) carries both vLLM's slow
    `llm_request` span and the plugin's lane windows (`otel_llm.vllm.lane`): the window the request ran
    in is kept with it, the one after it is dropped; another vLLM process's window of the same time too."""
    from types import SimpleNamespace as NS

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_llm.vllm.lane import VllmLane
    from otel_llm.vllm.stats import VllmStatsAggregator

    def process(pid: str):
        exporter = InMemorySpanExporter()
        tp = TracerProvider(resource=Resource.create({"service.name": "vllm", "vllm.process_id": pid}))
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        agg = VllmStatsAggregator("m", 1024, vllm_families=False)
        agg.lane = VllmLane("m", tp.get_tracer("otel_llm.vllm"))
        return tp, exporter, agg

    def step(agg, t, ttft=()):
        it = NS(iteration_timestamp=t, time_to_first_tokens_iter=list(ttft), inter_token_latencies_iter=[0.01],
                num_prompt_tokens=0, num_generation_tokens=1, num_preempted_reqs=0, max_num_generation_tokens_iter=[],
                n_params_iter=[], finished_requests=[])
        agg.record(None, it)

    clock = Clock()
    p, out = pipeline(TailSamplingConfig(keep_fraction=0.0, lane_wait_s=30), clock)
    tp, exporter, agg = process("101")
    t0 = 1_700_000_000.0
    for i in range(5):  # steps 0.1 s apart from t0 + 0.1: window one
        step(agg, t0 + 0.1 * (i + 1), ttft=[0.1] if i == 0 else ())
    agg.flush()
    for i in range(3):  # a request arrives 2.5 s later: window two
        step(agg, t0 + 3 + 0.1 * i, ttft=[0.05] if i == 0 else ())
    agg.flush()
    span = tp.get_tracer("vllm.llm_engine").start_span(
        "llm_request", start_time=int(t0 * 1e9), attributes={"gen_ai.latency.time_to_first_token": 5.0})
    span.end(int((t0 + 0.5) * 1e9))
    _, other, other_agg = process("102")
    step(other_agg, t0 + 0.3, ttft=[0.1])
    other_agg.flush()
    for spans in (exporter.get_finished_spans(), other.get_finished_spans()):
        p.consume(encode_spans(spans).SerializeToString())
    clock.t += 31
    p.tick()
    kept = [s for r in out.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sorted(s.name for s in kept) == ["engine steps", "llm_request"]
    [window] = [s for s in kept if s.name == "engine steps"]
    assert window.end_time_unix_nano <= int((t0 + 0.51) * 1e9)  # the first window
    stats = p.sampler.stats()
    assert stats.traces[("kept", "lane_overlap")] == 1 and stats.traces[("dropped", "lane_no_overlap")] == 2
