"""The engine lane: every step record of the reference engine carries the step itself (`StepLane`),
and it accounts exactly for what the engine did: prefill and decode tokens, distinct requests in the
batch, the scheduler's state after the step, why the queue waited (batch slots, KV blocks, token
budget), the forward pass's host time, and vLLM 0.32's FLOPs/bytes estimates for the step's batch."""

from __future__ import annotations

import time

import pytest
import torch
from engine_helpers import run_to_completion

from otel_llm import Telemetry, TelemetryConfig
from otel_llm.engine.step import Blocked, ForwardSource, StepRecord
from otel_llm.server.engine import SamplingParams
from otel_llm.server.engine.forward_timer import CudaEventTimer, HostTimer
from otel_llm.server.engine.perf import PerfEstimator

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def _lanes(telemetry: list) -> list:
    records = [StepRecord.from_bytes(t) for t in telemetry]
    assert all(r.lane is not None for r in records)
    return [(r, r.lane) for r in records]


def test_every_step_carries_its_lane_and_the_lane_accounts_exactly(dummy, make_engine):
    engine = make_engine(max_num_seqs=2, max_num_batched_tokens=64)
    prompts = {rid: list(range(5 + rid, 25 + rid)) for rid in range(3)}  # 20 tokens each, no shared prefix
    before = time.monotonic_ns()
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, GREEDY)
    tokens, _, _, telemetry = run_to_completion(engine)
    lanes = _lanes(telemetry)
    assert sum(lane.prefill_tokens for _, lane in lanes) == 60  # every prompt computed once
    assert sum(lane.decode_tokens for _, lane in lanes) == 3 * (4 - 1)  # the first token comes with the prefill
    for rec, lane in lanes:
        assert before <= lane.start_ns < rec.step_ts_ns
        assert lane.forward_source == ForwardSource.HOST and 0 < lane.forward_ns < rec.step_ts_ns - lane.start_ns
        assert lane.num_requests == len(set(rec.output_rid.tolist()))  # every request outputs each step here
        assert lane.flops > 0 and lane.read_bytes > 0 and lane.write_bytes > 0
    first, last = lanes[0][1], lanes[-1][1]
    assert (first.num_requests, first.prefill_tokens, first.running, first.waiting) == (2, 40, 2, 1)
    assert first.blocked == Blocked.SLOTS  # max_num_seqs=2: the third request waits for a slot
    assert (last.running, last.waiting, last.blocked) == (0, 0, Blocked.NONE)
    # vLLM's estimate of the first step: two prefills of 20 tokens, context 20 each
    perf = PerfEstimator.for_model(dummy.config, torch.float32)
    assert (first.flops, first.read_bytes, first.write_bytes) == perf.step([20, 20], [20, 20], [True, True])
    second = lanes[1][1]  # the decode-only step (the engine's shortcut): one token each at context 21
    assert (second.prefill_tokens, second.decode_tokens, second.num_requests) == (0, 2, 2)
    assert (second.flops, second.read_bytes, second.write_bytes) == perf.step([1, 1], [21, 21], [False, False])


def test_the_lane_says_when_the_queue_waits_for_kv_blocks_or_the_token_budget(make_engine):
    tight = make_engine(num_kv_blocks=8, block_size=4, max_num_seqs=8, max_model_len=32)  # 32 token slots: one 20-token prompt
    for rid in range(2):
        tight.add_request(rid, list(range(10 + rid, 30 + rid)), GREEDY)
    lane = StepRecord.from_bytes(tight.step().telemetry).lane
    assert (lane.running, lane.waiting, lane.blocked) == (1, 1, Blocked.KV)
    budget = make_engine(max_num_batched_tokens=16, max_num_seqs=8)
    for rid in range(2):
        budget.add_request(rid, list(range(10 + rid, 30 + rid)), GREEDY)
    lane = StepRecord.from_bytes(budget.step().telemetry).lane
    assert (lane.prefill_tokens, lane.waiting, lane.blocked) == (16, 1, Blocked.TOKENS)  # a chunk of the first


def test_the_lane_can_be_turned_off_and_the_null_model_estimates_nothing(make_engine):
    from otel_llm.server.model import load_model

    off = make_engine(engine_lane=False)
    off.add_request(0, [5, 6, 7], GREEDY)
    assert StepRecord.from_bytes(off.step().telemetry).lane is None
    null = make_engine(load_model("null", "float32"), model="null")
    null.add_request(0, [5, 6, 7], GREEDY)
    lane = StepRecord.from_bytes(null.step().telemetry).lane
    assert (lane.prefill_tokens, lane.flops, lane.forward_ns, lane.forward_source) == (3, 0, 0, ForwardSource.NONE)


def test_the_frontend_keeps_the_lane_and_sums_the_estimates_under_vllms_names(dummy, make_engine):
    """Through `Telemetry`: the steady decode steps too (their lane rides the fast path); the
    estimates are vLLM's `--enable-mfu-metrics` counters, absent unless turned on."""
    engine = make_engine()
    on = Telemetry(TelemetryConfig(model_name="dummy", mfu_metrics=True))
    off = Telemetry(TelemetryConfig(model_name="dummy"))
    for rid in range(3):
        engine.add_request(rid, list(range(10 + rid, 30 + rid)), GREEDY)
    _, _, _, telemetry = run_to_completion(engine)
    for t in telemetry:
        on.ingest(t)
        off.ingest(t)
    lanes = [StepRecord.from_bytes(t).lane for t in telemetry]
    on.snapshot()  # a read folds what the lane keeps
    cols = on.lane.columns()
    assert cols["prefill_tokens"].tolist() == [lane.prefill_tokens for lane in lanes]
    assert cols["end_ns"].tolist() == [StepRecord.from_bytes(t).step_ts_ns for t in telemetry]
    text = on.render().decode()
    flops = sum(lane.flops for lane in lanes)
    assert _sample(text, 'vllm:estimated_flops_per_gpu_total{model_name="dummy",engine="0"}') == flops
    assert "vllm:estimated_read_bytes_per_gpu_total{" in text and "vllm:estimated_write_bytes_per_gpu_total{" in text
    assert "estimated_" not in off.render().decode()
    assert "otel_llm_engine_estimated_read_bytes_total" in on.render(profile="otel").decode()


def test_a_lane_that_cannot_be_true_is_a_counted_drop(make_engine):
    engine = make_engine()
    tel = Telemetry(TelemetryConfig(model_name="dummy"))
    engine.add_request(0, [5, 6, 7], GREEDY)
    rec = StepRecord.from_bytes(engine.step().telemetry)
    for bad in (rec.lane._replace(start_ns=rec.step_ts_ns + 1), rec.lane._replace(kv_usage=float("nan")),
                rec.lane._replace(prefill_tokens=-1)):
        tel.ingest(rec._replace(lane=bad).to_bytes())
    tel.snapshot()
    assert tel.lane.total == 0 and tel.lane.dropped == 3
    assert 'otel_llm_telemetry_dropped_total{model_name="dummy",engine="0"} 3.0' in tel.render().decode()


def _sample(text: str, series: str) -> float:
    return float(next(line for line in text.splitlines() if line.startswith(series + " ")).split()[-1])


class _FakeEvent:
    """A CUDA event on a fake device clock (the CUDA path's logic, on CPU)."""

    clock_ms = 0.0

    def __init__(self):
        self.at, self.done = None, True

    def record(self):
        self.at = _FakeEvent.clock_ms

    def query(self):
        return self.done

    def elapsed_time(self, end):
        assert self.done and end.done, "elapsed_time on an incomplete event raises in torch"
        return end.at - self.at


def test_the_cuda_event_timer_reads_device_time_only_once_complete():
    timer = CudaEventTimer(_FakeEvent)
    assert timer.read_ns() == 0  # nothing recorded yet
    timer.start()
    _FakeEvent.clock_ms += 2.5
    timer.stop()
    assert timer.read_ns() == 2_500_000
    assert timer.read_ns() == 0  # read once per step
    timer.start()
    timer.stop()
    timer._end.done = False  # the device has not reached it: no wait, no figure
    assert timer.read_ns() == 0


def test_the_host_timer_brackets_the_call():
    ticks = iter([100, 350])
    timer = HostTimer(lambda: next(ticks))
    timer.start()
    timer.stop()
    assert timer.read_ns() == 250


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (the CUDA path's logic is tested above)")
def test_on_cuda_the_forward_time_comes_from_cuda_events(make_engine):
    engine = make_engine(device="cuda", dtype="bfloat16")
    engine.add_request(0, list(range(5, 69)), GREEDY)
    lane = StepRecord.from_bytes(engine.step().telemetry).lane
    assert lane.forward_source == ForwardSource.CUDA and lane.forward_ns > 0


def test_a_request_span_says_what_its_steps_were_and_whose_prefill_slowed_its_decode(make_engine):
    """Prefill-decode interference, seen from the victim: request A decodes alone, then B's long prompt
    is computed in chunks while A keeps decoding; A's span counts B's prompt tokens as interference,
    the steps it was in, the largest batch it shared and their forward time (the lanes' own figures)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_llm import RequestInfo

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = Telemetry(TelemetryConfig(model_name="dummy", tracing=True, tracer_provider=provider))
    engine = make_engine(max_num_batched_tokens=40)
    a = tel.arrival(RequestInfo(request_id="a", operation="text_completion", prompt_tokens=8))
    engine.add_request(a, list(range(5, 13)), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    telemetry = [engine.step().telemetry for _ in range(3)]  # A's prefill, then two steps of decode alone
    b = tel.arrival(RequestInfo(request_id="b", operation="text_completion", prompt_tokens=100))
    engine.add_request(b, list(range(20, 120)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    telemetry += run_to_completion(engine)[3]
    for t in telemetry:
        tel.ingest(t)
    lanes = [StepRecord.from_bytes(t) for t in telemetry]
    spans = {s.attributes["gen_ai.request.id"]: s for s in exporter.get_finished_spans() if "gen_ai.request.id" in s.attributes}
    span_a = spans["a"].attributes
    a_steps = [r for r in lanes if a in r.output_rid.tolist()]  # A outputs in every step it is in
    assert span_a["otel_llm.engine.steps"] == len(a_steps) == 12
    assert span_a["otel_llm.engine.interfering_prefill_tokens"] == 100  # all of B's prompt, in 40-token chunks
    assert span_a["otel_llm.engine.max_batch_requests"] == 2
    assert span_a["gen_ai.latency.time_in_model_forward"] == pytest.approx(
        sum(r.lane.forward_ns for r in a_steps) * 1e-9, abs=1e-9)
    span_b = spans["b"].attributes
    assert span_b["otel_llm.engine.interfering_prefill_tokens"] == 0  # nothing prefilled during B's decode
    assert span_b["otel_llm.engine.max_batch_requests"] == 2


def _traced_telemetry():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Telemetry(TelemetryConfig(model_name="dummy", tracing=True, tracer_provider=provider)), exporter


def test_the_lane_goes_out_as_window_spans_that_give_back_every_step(make_engine):
    """Every step leaves in exactly one `engine steps` span (a trace of its own), whose array
    attributes give the step back; the engine going idle closes the window at once."""
    from otel_llm.export.lane_spans import LANE_SPAN, lane_steps

    tel, exporter = _traced_telemetry()
    engine = make_engine(max_num_seqs=4)
    for rid in range(6):
        engine.add_request(rid, list(range(10 + rid, 40 + rid)), SamplingParams(temperature=0, max_tokens=20,
                                                                                ignore_eos=True))
    _, _, _, telemetry = run_to_completion(engine)
    for t in telemetry:
        tel.ingest(t)
    windows = [s for s in exporter.get_finished_spans() if s.name == LANE_SPAN]
    assert windows, "the idle engine's last step closes the window"
    lanes = [StepRecord.from_bytes(t) for t in telemetry]
    steps = [lane_steps(s.attributes, s.start_time) for s in windows]
    assert sum(len(c["end_ns"]) for c in steps) == len(lanes)
    assert len({s.context.trace_id for s in windows}) == len(windows)
    got_prefill = [int(v) for c in steps for v in c["prefill_tokens"]]
    assert got_prefill == [r.lane.prefill_tokens for r in lanes]
    got_batch = [int(v) for c in steps for v in c["num_requests"]]
    assert got_batch == [r.lane.num_requests for r in lanes]
    durations = [int(v) for c in steps for v in c["end_ns"] - c["start_ns"]]
    assert durations == [(r.step_ts_ns - r.lane.start_ns) // 1000 * 1000 for r in lanes]  # µs on the wire
    for s in windows:
        assert s.attributes["otel_llm.lane.forward_source"] == "host" and s.attributes["otel_llm.engine"] == "0"
        assert s.end_time >= s.start_time
