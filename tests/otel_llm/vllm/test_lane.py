"""VllmLane: vLLM's per-step stats (duck-typed here) -> engine lane windows through a real OTel SDK tracer."""

from types import SimpleNamespace as NS

import numpy as np
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.export.lane_spans import LANE_SPAN, lane_steps
from otel_llm.vllm.lane import WINDOW_STEPS, VllmLane
from otel_llm.vllm.stats import VllmStatsAggregator

T0 = 1_700_000_000.0  # epoch seconds


def provider():
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"vllm.process_id": "42"}))  # as vLLM's init_otel_tracer
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


def it(t, ttft=(), itl=(), computed=0, gen=0, preempted=0):
    return NS(iteration_timestamp=t, time_to_first_tokens_iter=list(ttft), inter_token_latencies_iter=list(itl),
              prompt_token_stats=NS(computed=computed, total=computed, local_cache_hit=0, external_kv_transfer=0,
                                    cached_tokens=0),
              num_generation_tokens=gen, num_preempted_reqs=preempted, max_num_generation_tokens_iter=[],
              n_params_iter=[], finished_requests=[])


def sched(running, waiting, kv, details=None):
    return NS(num_running_reqs=running, num_waiting_reqs=waiting, num_skipped_waiting_reqs=0, kv_cache_usage=kv,
              prefix_cache_stats=NS(queries=0, hits=0), connector_prefix_cache_stats=None, iteration_details=details)


def windows(exporter):
    out = []
    for span in exporter.get_finished_spans():
        assert span.name == LANE_SPAN and span.parent is None
        out.append((span, lane_steps(dict(span.attributes), span.start_time)))
    return out


def test_steps_become_lane_rows_from_what_vllm_hands_the_logger():
    tp, exporter = provider()
    agg = VllmStatsAggregator("tiny", 1024, vllm_families=False)
    agg.lane = VllmLane("tiny", tp.get_tracer("t"))
    # an idle engine woken by a request that arrived 30 ms before its first token: the prefill step
    agg.record(sched(1, 2, 0.25), it(T0, ttft=[0.030], computed=100, gen=1))
    agg.record(sched(2, 0, 0.5), it(T0 + 0.010, ttft=[0.005], itl=[0.010], computed=40, gen=2))  # mixed
    agg.record(None, it(T0 + 0.018, itl=[0.008, 0.008], gen=2, preempted=1))  # no SchedulerStats here
    agg.flush()
    [(span, cols)] = windows(exporter)
    ns = np.int64(1e9)
    ends = (np.array([T0, T0 + 0.010, T0 + 0.018]) * ns).astype(np.int64)
    assert np.abs(cols["end_ns"] - ends).max() <= 1000  # µs on the wire
    # the first starts at its request's arrival; the second at its request's, later than the first's end;
    # the third where the second ended
    assert abs(cols["start_ns"][0] - (ends[0] - 30_000_000)) <= 1000
    assert abs(cols["start_ns"][1] - (ends[1] - 5_000_000)) <= 1000
    assert cols["start_ns"][2] == cols["end_ns"][1]
    assert cols["prefill_tokens"].tolist() == [100, 40, 0]
    assert cols["decode_tokens"].tolist() == [0, 1, 2]
    assert cols["num_requests"].tolist() == [1, 2, 2]
    assert cols["running"].tolist() == [1, 2, 2] and cols["waiting"].tolist() == [2, 0, 0]  # the last seen carries
    assert cols["kv_usage"].tolist() == [0.25, 0.5, 0.5] and cols["preemptions"].tolist() == [0, 0, 1]
    assert cols["blocked"].tolist() == [4, 0, 0]  # requests waited (vLLM does not say why): `other`
    assert (cols["forward_ns"] == -1).all() and span.attributes["otel_llm.lane.forward_source"] == "none"
    assert span.attributes["gen_ai.request.model"] == "tiny" and span.attributes["otel_llm.engine"] == "0"
    assert span.resource.attributes["vllm.process_id"] == "42"  # the provider's: vLLM's request spans' resource
    assert agg.lane.steps == 3


def test_iteration_details_give_scheduled_tokens_and_vllms_step_time():
    """With --enable-logging-iteration-details: the scheduled prompt tokens (every chunk), the batch, and
    vLLM's elapsed time of the step as a host-measured forward time."""
    tp, exporter = provider()
    agg = VllmStatsAggregator("tiny", 1024, vllm_families=False)
    agg.lane = VllmLane("tiny", tp.get_tracer("t"))
    details = NS(num_ctx_requests=1, num_ctx_tokens=512, num_generation_requests=3, num_generation_tokens=3,
                 elapsed_ms=12.5, is_dummy=False)
    agg.record(sched(4, 0, 0.1, details), it(T0, itl=[0.01] * 3, gen=3))  # a chunk: no first token yet
    agg.flush()
    [(span, cols)] = windows(exporter)
    assert cols["prefill_tokens"].tolist() == [512] and cols["num_requests"].tolist() == [4]
    assert cols["forward_ns"].tolist() == [12_500_000] and span.attributes["otel_llm.lane.forward_source"] == "host"


def test_windows_hold_at_most_256_steps_or_one_second():
    """Steps of 1 ms: windows of 256 steps, the rest in one; a step after a 5 s gap in its own."""
    tp, exporter = provider()
    agg = VllmStatsAggregator("tiny", 1024, vllm_families=False, flush_every=10_000)
    agg.lane = VllmLane("tiny", tp.get_tracer("t"))
    for i in range(600):  # 600 steps of 1 ms, then a step 5 s later
        agg.record(sched(1, 0, 0.1), it(T0 + i * 0.001, itl=[0.001], gen=1))
    agg.record(sched(1, 0, 0.1), it(T0 + 5.6, itl=[0.001], gen=1))
    agg.flush()
    got = windows(exporter)
    assert [len(c["end_ns"]) for _, c in got] == [WINDOW_STEPS, WINDOW_STEPS, 600 - 2 * WINDOW_STEPS, 1]
    assert all(c["end_ns"][-1] - c["start_ns"][0] <= 1_000_000_000 for _, c in got[:-1])
    # a step whose outputs came 5 s after the last ones (no request arrived to bound it) is one long step
    assert abs(got[-1][1]["start_ns"][0] - got[-2][1]["end_ns"][-1]) <= 2000  # µs on the wire, float seconds


def test_a_lane_that_fails_is_turned_off_and_the_metrics_go_on():
    agg = VllmStatsAggregator("tiny", 1024, vllm_families=False)
    agg.lane = VllmLane("tiny", None)  # no tracer: export fails
    agg.record(sched(1, 0, 0.1), it(T0, ttft=[0.01], computed=10, gen=1))
    agg.flush()
    assert agg.lane is None and agg.errors == 1 and agg.dropped == 0
    agg.record(sched(1, 0, 0.1), it(T0 + 1, itl=[0.01], gen=1))
    agg.flush()
    assert agg.engines[0].snapshot().counters["otel_llm.usage.generation_tokens"][0] == 2
