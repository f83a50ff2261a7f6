"""The families of later vLLM-Omni releases through the SDK: tokens, queue wait, failures by reason,
per-stage generation time, in-queue time and waiting requests, speech streams; exact counts,
vLLM-Omni's bounded vocabularies, bad values dropped and counted."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.otel_llm.pipeline.test_telemetry import MS, SECOND, pipeline, samples, value


def test_present_from_the_start_as_vllm_omni_binds_them():
    p, _ = pipeline()
    have = samples(p)
    for name in ("vllm_omni:prompt_tokens_total", "vllm_omni:generation_tokens_total",
                 "vllm_omni:request_queue_wait_s_count"):
        assert have[(name, (("model_name", "tts"),))] == 0
    assert not any(name.startswith(("vllm_omni:requests_failed", "vllm_omni:stage_", "vllm_omni:speech_stream"))
                   for name, _ in have)  # those appear with their first observation


def test_a_completed_request_counts_its_tokens_and_queue_wait():
    p, clock = pipeline()
    r = p.arrival("r")
    clock.t += 250 * MS
    r.stage_started("0", "0")
    clock.t += SECOND
    r.finish("stop", prompt_tokens=12, generation_tokens=30)
    p.arrival("never started").finish("length", prompt_tokens=3)
    assert value(p, "vllm_omni:prompt_tokens_total") == 15
    assert value(p, "vllm_omni:generation_tokens_total") == 30
    assert value(p, "vllm_omni:request_queue_wait_s_count") == 1  # arrival to its first stage's start
    assert value(p, "vllm_omni:request_queue_wait_s_sum") == 0.25
    assert value(p, "vllm_omni:request_queue_wait_s_bucket", le="0.25") == 1
    assert value(p, "vllm_omni:request_queue_wait_s_bucket", le="0.1") == 0


def test_failures_count_as_abort_and_by_reason_without_latency_or_tokens():
    p, clock = pipeline()
    for reason in ("client_abort", "client_disconnect", "stage_error", "stage_error", "a reason of its own"):
        r = p.arrival(reason)
        r.stage_started("0", "0")
        clock.t += SECOND
        r.fail(reason)
    p.arrival("gone").abort()  # the client went away
    assert value(p, "vllm_omni:requests_success_total", finished_reason="abort") == 6
    assert value(p, "vllm_omni:requests_failed_total", reason="client_abort") == 1
    assert value(p, "vllm_omni:requests_failed_total", reason="client_disconnect") == 2
    assert value(p, "vllm_omni:requests_failed_total", reason="stage_error") == 2
    assert value(p, "vllm_omni:requests_failed_total", reason="unknown") == 1  # vLLM-Omni's bounded vocabulary
    assert value(p, "vllm_omni:e2e_request_latency_s_count") == 0
    assert value(p, "vllm_omni:request_queue_wait_s_count") == 0
    assert value(p, "vllm_omni:num_requests_running") == 0 and value(p, "vllm_omni:num_requests_waiting") == 0
    assert value(p, "vllm_omni:stage_gen_time_s_count", stage="0", stage_type="llm") is None  # never ended itself


def test_every_visit_that_ends_observes_its_stage_by_type():
    p, clock = pipeline(diffusion_stages=("2",))
    r = p.arrival("r")
    for stage, seconds in (("0", 0.5), ("1", 2.0), ("2", 30.0)):
        r.stage_started(stage, "0")
        clock.t += int(seconds * SECOND)
        r.stage_finished(stage, "0")
    r.stage_started("1", "1")
    clock.t += SECOND
    r.finish()  # closes the open visit: not a generation time of its own
    assert value(p, "vllm_omni:stage_gen_time_s_sum", stage="0", stage_type="llm") == 0.5
    assert value(p, "vllm_omni:stage_gen_time_s_count", stage="1", stage_type="llm") == 1
    assert value(p, "vllm_omni:stage_gen_time_s_bucket", stage="2", stage_type="diffusion", le="20.0") == 0
    assert value(p, "vllm_omni:stage_gen_time_s_bucket", stage="2", stage_type="diffusion", le="30.0") == 1


def test_in_queue_time_from_the_enqueue_a_stage_reports():
    p, clock = pipeline()
    r = p.arrival("r")
    queued = clock.t
    clock.t += 3 * MS
    r.stage_started("1", "0", queued_ns=queued)
    r.stage_started("1", "1", queued_ns=clock.t)  # zero is the healthy baseline, and counted
    r.stage_started("1", "2", queued_ns=clock.t + 1)  # enqueued after it started: dropped, counted
    assert value(p, "vllm_omni:stage_in_queue_s_count", stage="1") == 2
    assert value(p, "vllm_omni:stage_in_queue_s_bucket", stage="1", le="0.001") == 1
    assert value(p, "vllm_omni:stage_in_queue_s_bucket", stage="1", le="0.005") == 2
    assert p.dropped == 1


def test_stage_waiting_sums_the_replicas_latest_snapshots():
    p, _ = pipeline()
    p.stage_waiting("0", "0", 4)
    p.stage_waiting("0", "1", 2)
    p.stage_waiting("0", "0", 1)  # the latest replaces the replica's last
    talker = {"0": 3, "1": 0}
    p.watch_stage_waiting("1", "0", lambda: talker["0"])
    p.watch_stage_waiting("1", "1", lambda: talker["1"])
    assert value(p, "vllm_omni:stage_waiting_requests", stage="0") == 3
    assert value(p, "vllm_omni:stage_waiting_requests", stage="1") == 3
    talker["1"] = 5
    assert value(p, "vllm_omni:stage_waiting_requests", stage="1") == 8  # read at every read
    talker["1"] = -1  # not a count: the replica keeps its last snapshot
    p.stage_waiting("0", "2", 1.5)
    assert value(p, "vllm_omni:stage_waiting_requests", stage="1") == 8
    assert value(p, "vllm_omni:stage_waiting_requests", stage="0") == 3 and p.dropped >= 2


def test_stage_waiting_replicas_are_bounded():
    p, _ = pipeline(cardinality_limit=2)
    for replica in "0123":
        p.stage_waiting("0", replica, 1)
    assert value(p, "vllm_omni:stage_waiting_requests", stage="0") == 2 and p.dropped == 2


def test_speech_streams_completed_and_aborted_by_reason():
    p, _ = pipeline()
    for _ in range(3):
        p.stream_completed()
    for reason in ("closed", "cancelled", "engine_dead", "error", "closed", "anything else"):
        p.stream_aborted(reason)
    assert value(p, "vllm_omni:speech_stream_completed_total") == 3
    aborted = {k[1][1][1]: v for k, v in samples(p).items() if k[0] == "vllm_omni:speech_stream_aborted_total"}
    assert aborted == {"closed": 2, "cancelled": 1, "engine_dead": 1, "error": 2}


def test_bad_tokens_are_dropped_and_the_request_still_counts():
    p, _ = pipeline()
    p.arrival("r").finish("stop", prompt_tokens=-1, generation_tokens=5)
    p.arrival("s").finish("stop", prompt_tokens="7")
    assert value(p, "vllm_omni:prompt_tokens_total") == 0 and value(p, "vllm_omni:generation_tokens_total") == 0
    assert value(p, "vllm_omni:requests_success_total", finished_reason="stop") == 2 and p.dropped == 2


def test_a_failed_requests_span_names_its_reason():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    p, _ = pipeline(tracer_provider=provider)
    p.arrival("r").fail("stage_error")
    (root,) = exporter.get_finished_spans()
    assert root.attributes["error.type"] == "stage_error"
    assert root.attributes["gen_ai.response.finish_reasons"] == ("abort",)


def test_the_otel_profile_and_a_reader_carry_them_as_otel_instruments():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_llm.export.metric_producer import attach_reader

    p, clock = pipeline(cardinality_limit=1)
    r = p.arrival("r")
    r.stage_started("0", "0")
    clock.t += SECOND
    r.stage_finished("0", "0")
    r.stage_started("1", "0")
    r.stage_finished("1", "0")  # a second stage beyond the limit of one: its series overflows
    r.finish("stop", prompt_tokens=4, generation_tokens=9)
    p.stage_waiting("0", "0", 2)
    text = p.render(profile="otel").decode()
    assert 'otel_llm_pipeline_tokens_generation_total{gen_ai_request_model="tts"} 9' in text
    assert ('otel_llm_pipeline_stage_generation_time_seconds_count{gen_ai_request_model="tts",'
            'otel_llm_pipeline_stage="0",otel_llm_pipeline_stage_type="llm"} 1') in text
    assert "vllm_omni:" not in text and p.render(profile="sglang") == p.render()  # vLLM-Omni's under the others
    reader = InMemoryMetricReader()
    attach_reader(reader, [], producers=[p.to_metrics])
    metrics = {m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics}
    tokens = metrics["otel_llm.pipeline.tokens.generation"]
    assert tokens.unit == "{token}" and tokens.data.is_monotonic
    assert [(dict(pt.attributes), pt.value) for pt in tokens.data.data_points] == [
        ({"gen_ai.request.model": "tts"}, 9.0)]
    gen, over = metrics["otel_llm.pipeline.stage.generation_time"].data.data_points
    assert dict(over.attributes) == {"otel.metric.overflow": True} and over.count == 1
    assert dict(gen.attributes) == {"gen_ai.request.model": "tts", "otel_llm.pipeline.stage": "0",
                                    "otel_llm.pipeline.stage_type": "llm"}
    assert gen.count == 1 and gen.sum == 1.0 and gen.explicit_bounds[0] == 0.05 and sum(gen.bucket_counts) == 1
    (waiting,) = metrics["otel_llm.pipeline.stage.waiting"].data.data_points
    assert (dict(waiting.attributes), waiting.value) == ({"gen_ai.request.model": "tts",
                                                          "otel_llm.pipeline.stage": "0"}, 2.0)
