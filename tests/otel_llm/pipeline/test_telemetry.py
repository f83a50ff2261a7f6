"""PipelineTelemetry: exact counts through the SDK, transfer hops, audio, bounds, gate, spans."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from otel_llm.pipeline import PipelineConfig, PipelineTelemetry, TransferHop
from otel_llm.pipeline.families import FAMILIES

MS = 1_000_000
SECOND = 1000 * MS


class Clock:
    def __init__(self):
        self.t = 10 * SECOND

    def __call__(self) -> int:
        return self.t


def pipeline(**config) -> tuple[PipelineTelemetry, Clock]:
    clock = Clock()
    return PipelineTelemetry(PipelineConfig("tts", sample_rate=8000, **config), clock=clock), clock


def samples(p: PipelineTelemetry) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, parsed back from the text exposition."""
    out = {}
    for fam in text_string_to_metric_families(p.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(p, name, **labels):
    return samples(p).get((name, tuple(sorted({"model_name": "tts", **labels}.items()))))


def hop(fs, fr, ts, tr, t0, size=5000):
    return TransferHop(fs, fr, ts, tr, size, t0, t0 + 2 * MS, t0 + 5 * MS, t0 + 6 * MS)


def test_requests_finish_by_reason_and_gauges_return_to_zero():
    p, clock = pipeline()
    reasons = ["stop"] * 5 + ["length"] * 2 + ["abort"] * 3
    reqs = [p.arrival(f"r{i}") for i in range(len(reasons))]
    assert value(p, "vllm_omni:num_requests_waiting") == 10
    for r in reqs[:6]:
        r.stage_started("0", "0")
    assert value(p, "vllm_omni:num_requests_running") == 6 and value(p, "vllm_omni:num_requests_waiting") == 4
    clock.t += SECOND
    for r, reason in zip(reqs, reasons):
        if reason == "abort":
            r.abort()  # a client disconnect: 2 of them never started
        else:
            r.finish(reason)
    assert value(p, "vllm_omni:requests_success_total", finished_reason="stop") == 5
    assert value(p, "vllm_omni:requests_success_total", finished_reason="length") == 2
    assert value(p, "vllm_omni:requests_success_total", finished_reason="abort") == 3
    assert value(p, "vllm_omni:requests_failed_total", reason="client_disconnect") == 3  # and only those
    assert value(p, "vllm_omni:e2e_request_latency_s_count") == 7  # the completed ones (as vLLM-Omni)
    assert value(p, "vllm_omni:e2e_request_latency_s_sum") == 7.0
    assert value(p, "vllm_omni:request_queue_wait_s_count") == 6  # completed, and a stage had started them
    assert value(p, "vllm_omni:num_requests_running") == 0 and value(p, "vllm_omni:num_requests_waiting") == 0


def test_one_transfer_observation_per_hop_per_edge():
    p, _ = pipeline()
    r = p.arrival("r")
    r.transfer(hop("0", "0", "1", "0", 0))
    r.transfer(hop("0", "0", "1", "0", 10 * MS, size=70000))
    r.transfer(hop("0", "1", "1", "1", 20 * MS))
    edge = {"from_stage": "0", "from_replica": "0", "to_stage": "1", "to_replica": "0"}
    assert value(p, "vllm_omni:transfer_size_bytes_count", **edge) is None  # a request's hops are folded in batches
    r.finish("stop")
    for fam in ("size_bytes", "tx_s", "rx_s", "in_flight_s"):
        assert value(p, f"vllm_omni:transfer_{fam}_count", **edge) == 2
        assert value(p, f"vllm_omni:transfer_{fam}_count", **{**edge, "from_replica": "1", "to_replica": "1"}) == 1
    assert value(p, "vllm_omni:transfer_size_bytes_sum", **edge) == 75000
    assert value(p, "vllm_omni:transfer_size_bytes_bucket", **edge, le="65536.0") == 1
    assert value(p, "vllm_omni:transfer_tx_s_sum", **edge) == pytest.approx(0.004)
    assert value(p, "vllm_omni:transfer_in_flight_s_sum", **edge) == pytest.approx(0.006)
    assert value(p, "vllm_omni:transfer_rx_s_sum", **edge) == pytest.approx(0.002)


def test_a_running_request_hands_over_its_hops_in_bounded_batches():
    from otel_llm.pipeline.request import FOLD_HOPS

    p, _ = pipeline()
    r = p.arrival("r")
    for i in range(2 * FOLD_HOPS + 3):
        r.transfer(hop("0", "0", "1", "0", i * MS))
    edge = {"from_stage": "0", "from_replica": "0", "to_stage": "1", "to_replica": "0"}
    assert value(p, "vllm_omni:transfer_rx_s_count", **edge) == 2 * FOLD_HOPS
    assert len(r._pending) == 3 and r.hops == []  # no span: the hops are not kept
    r.abort()
    assert value(p, "vllm_omni:transfer_rx_s_count", **edge) == 2 * FOLD_HOPS + 3


def test_a_sender_hands_over_hops_in_batches_of_rows():
    """`transfers(edge, rows)`: the same observations as one `transfer` per hop, from a flat
    array('q') or an [n, 5] array; bad rows dropped (counted), a ragged batch dropped once."""
    one, _ = pipeline()
    batched, _ = pipeline()
    hops = [hop("0", "0", "1", "0", i * MS, size=100 * i) for i in range(5)]
    r = one.arrival("r")
    for h in hops:
        r.transfer(h)
    r.finish("stop")
    b = batched.arrival("r")
    edge = ("0", "0", "1", "0")
    b.transfers(edge, array("q", [x for h in hops[:3] for x in h[4:]]))
    b.transfers(edge, np.array([h[4:] for h in hops[3:]]))
    b.transfers(edge, array("q"))  # nothing: nothing counted
    assert batched.dropped == 0
    b.transfers(edge, np.array([[10, 5, 4, 6, 7], [-1, 5, 6, 6, 7]]))  # tx ends before it starts; negative size
    b.transfers(("0", 0, "1", "0"), np.array([h[4:] for h in hops]))  # not a stage name: the whole batch
    b.transfers(edge, [1, 2, 3])  # not whole hops
    assert batched.dropped == 2 + 5 + 1
    b.finish("stop")
    b.transfers(edge, np.array([h[4:] for h in hops]))  # after the finish: refused, counted once
    assert batched.dropped == 9
    def transfer(p):
        return {k: v for k, v in samples(p).items() if "transfer" in k[0]}

    assert value(batched, "vllm_omni:transfer_rx_s_count", **dict(zip(("from_stage", "from_replica", "to_stage",
                                                                       "to_replica"), edge))) == 5
    assert transfer(batched) == pytest.approx(transfer(one))  # every bucket, count and sum of the four families


def test_valid_hops_are_kept_until_a_full_batch_or_a_read():
    """The pipeline folds hops PENDING_HOPS at a time (bounded memory), and every read sees all of them."""
    from otel_llm.pipeline.telemetry import PENDING_HOPS

    p, _ = pipeline()
    edge = ("0", "0", "1", "0")
    labels = dict(zip(("from_stage", "from_replica", "to_stage", "to_replica"), edge))
    r = p.arrival("r")
    r.transfers(edge, np.array([[100, 0, 1, 2, 3]] * (PENDING_HOPS - 1)))
    assert p._num_hops == PENDING_HOPS - 1  # kept
    r.transfers(edge, np.array([[100, 0, 1, 2, 3]] * 2))
    assert p._num_hops == 0  # a full batch: folded without a read
    r.transfers(edge, np.array([[100, 0, 1, 2, 3]] * 3))
    assert value(p, "vllm_omni:transfer_size_bytes_count", **labels) == PENDING_HOPS + 4  # a read folds the rest
    assert value(p, "vllm_omni:transfer_size_bytes_sum", **labels) == 100 * (PENDING_HOPS + 4)
    assert p._num_hops == 0


def test_batched_hops_are_drawn_as_spans_only_when_valid():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    p, clock = pipeline(tracer_provider=provider)
    r = p.arrival("r", trace_headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    r.stage_started("0", "0")
    good = hop("0", "0", "1", "0", clock.t)
    r.transfers(good[:4], np.array([good[4:], (1, 9, 8, 9, 9)]))  # the second: tx ends before it starts
    r.finish("stop")
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("transfer")]
    assert len(spans) == 1 and (spans[0].start_time, spans[0].end_time) == (
        good.tx_start_ns - p.anchor[1] + p.anchor[0], good.rx_end_ns - p.anchor[1] + p.anchor[0])


def test_audio_frames_are_the_pcm_samples_and_ttfp_within_e2e():
    p, clock = pipeline(continuity_thresholds_ms=(50, 100))
    total = 0
    for i in range(3):
        r = p.arrival(f"r{i}", audio=True)
        clock.t += 100 * MS
        r.stage_started("1", "0")
        for k in range(4):
            clock.t += 125 * MS
            r.audio_chunk("1", "0", 2000 + 2 * k)
            total += 2000 + 2 * k
        clock.t += 10 * MS
        r.finish("stop")
    stage = {"stage": "1", "replica": "0"}
    assert value(p, "vllm_omni:audio_frames_total", **stage) == total // 2
    assert value(p, "vllm_omni:audio_ttfp_s_count", **stage) == 3
    assert value(p, "vllm_omni:audio_duration_s_count", **stage) == 3
    assert value(p, "vllm_omni:audio_rtf_count", **stage) == 3
    ttfp = value(p, "vllm_omni:audio_ttfp_s_sum", **stage) / 3
    e2e = value(p, "vllm_omni:e2e_request_latency_s_sum") / 3
    assert ttfp == pytest.approx(0.225) and ttfp <= e2e
    for t in ("50", "100"):
        assert value(p, "vllm_omni:audio_continuity_ok_total", **stage, threshold_ms=t) == 3
    assert value(p, "vllm_omni:audio_underrun_s_count", **stage) == 3


def test_audio_chunks_at_once_equal_one_by_one():
    """`audio_chunks` (a sender that keeps its chunks) observes what one `audio_chunk` per chunk
    does; bad rows are dropped (counted) and the rest kept."""
    one, one_clock = pipeline()
    batched, _ = pipeline()
    times = [10 * SECOND + k * 50 * MS for k in range(1, 6)]
    sizes = [0, 800, 1600, 1600, 1600]
    r = one.arrival("r", audio=True)
    for t, b in zip(times, sizes):
        r.audio_chunk("1", "0", b, t)
    one_clock.t = times[-1]
    r.finish("stop", gen_time_s=0.2)
    b = batched.arrival("r", audio=True)
    b.audio_chunks("1", "0", array("q", times[:2]), array("q", sizes[:2]))
    assert value(batched, "vllm_omni:audio_ttfp_s_count", stage="1", replica="0") == 1  # at the first audio
    b.audio_chunks("1", "0", [5 * SECOND, times[2], times[2]], [800, -1, sizes[2]])  # before arrival; negative
    assert batched.dropped == 2
    b.audio_chunks("1", "0", times[3:], sizes[3:])
    b.finish("stop", now_ns=times[-1], gen_time_s=0.2)
    audio = {k: v for k, v in samples(one).items() if "audio" in k[0]}
    assert audio and {k: v for k, v in samples(batched).items() if "audio" in k[0]} == audio


def test_stall_fails_continuity_and_empty_audio_is_skipped():
    p, clock = pipeline(continuity_thresholds_ms=(100, 500))
    r = p.arrival("stall", audio=True)
    r.stage_started("1", "0")
    for gap in (0, 125, 500, 125):  # 0.375 s late on the third chunk
        clock.t += gap * MS
        r.audio_chunk("1", "0", 2000)
    r.finish()
    stage = {"stage": "1", "replica": "0"}
    assert value(p, "vllm_omni:audio_continuity_ok_total", **stage, threshold_ms="100") is None
    assert value(p, "vllm_omni:audio_continuity_ok_total", **stage, threshold_ms="500") == 1
    assert value(p, "vllm_omni:audio_underrun_s_sum", **stage) == pytest.approx(0.375)
    empty = p.arrival("empty", audio=True)
    empty.stage_started("1", "1")
    empty.finish()
    assert value(p, "vllm_omni:audio_skipped_requests_total", stage="1", replica="1", reason="no_audio_data") == 1
    assert value(p, "vllm_omni:audio_frames_total", stage="1", replica="1") is None


def test_abort_keeps_ttfp_and_skips_the_finalize():
    p, clock = pipeline()
    r = p.arrival("r", audio=True)
    clock.t += 300 * MS
    r.audio_chunk("1", "0", 2000)
    r.abort()
    r.finish("stop")  # after the finish: dropped
    assert value(p, "vllm_omni:audio_ttfp_s_count", stage="1", replica="0") == 1
    assert value(p, "vllm_omni:audio_frames_total", stage="1", replica="0") is None
    assert value(p, "vllm_omni:requests_success_total", finished_reason="abort") == 1
    assert p.dropped == 1


def test_series_appear_only_once_they_have_data():
    p, _ = pipeline()
    text = p.render().decode()
    assert "audio" not in text and "transfer" not in text and "requests_success" not in text
    assert "vllm_omni:e2e_request_latency_s_count" in text  # bound at construction, as vLLM-Omni's
    r = p.arrival("r", audio=True)
    r.stage_started("1", "0")
    r.audio_chunk("1", "0", 2000)
    r.finish()
    text = p.render().decode()
    assert 'replica="0"' in text and 'replica="1"' not in text


def test_bad_values_are_dropped_and_counted_never_raised():
    p, clock = pipeline()
    r = p.arrival("r", audio=True)
    r.audio_chunk("1", "0", -5)
    r.transfer(TransferHop("0", "0", "1", "0", 10, 5, 4, 6, 7))  # tx ends before it starts
    r.transfer(TransferHop("0", "0", "1", "0", -1, 5, 6, 6, 7))  # a negative size
    r.transfer(TransferHop("0", "0", "1", "0", 10, 5, 6, 7, 7))  # a good one, kept
    r.transfer(TransferHop("0", 0, "1", "0", 10, 5, 6, 7, 7))  # a replica that is not a string
    r.transfer(TransferHop("0", "0", "1", "0", None, 5, 6, 7, 7))  # not a number
    r.stage_finished("2", "0")  # never started
    p.observe_audio_ttfp("1", "0", float("nan"))
    assert p.dropped == 3  # hops are checked when they are observed: in batches, and at the finish
    r.finish()
    assert p.dropped == 3 + 4 + 1  # the four bad hops; the audio skip, which has no stage to go on
    text = p.render().decode()
    assert 'vllm_omni:transfer_size_bytes_count{model_name="tts",from_stage="0",from_replica="0",to_stage="1",' \
           'to_replica="0"} 1' in text


def test_cardinality_limit_folds_new_edges_into_the_overflow_series():
    p, _ = pipeline(cardinality_limit=2)
    for replica in "0123":
        p.observe_transfer(hop("0", replica, "1", "0", 0))
    text = p.render().decode()
    assert text.count("vllm_omni:transfer_size_bytes_count{") == 3
    assert 'vllm_omni:transfer_size_bytes_count{otel_metric_overflow="true"} 2' in text
    assert p.overflowed == {f"vllm_omni:transfer_{f}": 2 for f in ("size_bytes", "tx_s", "rx_s", "in_flight_s")}


def test_prefix_option_and_openmetrics():
    assert PipelineConfig("m").prefix == "vllm_omni:"  # vLLM-Omni's; the design's first release's is an option
    p, _ = pipeline(prefix="vllm:omni_")
    r = p.arrival("r")
    r.transfer(hop("0", "0", "1", "0", 0))
    r.finish()
    families = {f.name: f for f in parse_openmetrics(p.render(openmetrics=True).decode() + "# EOF\n")}
    assert {"vllm:omni_requests_success", "vllm:omni_e2e_request_latency_s", "vllm:omni_transfer_tx_s"} <= set(families)
    assert families["vllm:omni_requests_success"].type == "counter"
    assert not any(name.startswith("vllm_omni:") for name in families)
    with pytest.raises(ValueError, match="prefix"):
        PipelineConfig("m", prefix="omni_")


def test_stats_off_allocates_records_and_renders_nothing():
    p = PipelineTelemetry(PipelineConfig("tts", enabled=False))
    r = p.arrival("r", audio=True)
    r.stage_started("0", "0")
    r.audio_chunk("0", "0", 100)
    r.transfer(hop("0", "0", "1", "0", 0))
    r.finish()
    p.observe_transfer(hop("0", "0", "1", "0", 0))
    assert p.render() == b"" and p.render(openmetrics=True) == b"" and not hasattr(p, "_sets")


def test_family_table_matches_vllm_omni():
    assert len(FAMILIES) == 24  # each checked against the release in test_released_vllm_omni.py
    p, _ = pipeline()
    names = [p.config.prefix + f.stem for f in FAMILIES]
    assert "vllm_omni:transfer_in_flight_s" in names and "vllm_omni:speech_stream_aborted" in names


def test_pipeline_spans_agree_with_the_histograms():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    p, clock = pipeline(tracer_provider=provider)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    r = p.arrival("r", trace_headers={"traceparent": parent}, audio=True)
    t0 = clock.t
    clock.t += 10 * MS
    r.stage_started("0", "0")
    clock.t += 200 * MS
    r.stage_finished("0", "0")
    r.transfer(hop("0", "0", "1", "0", clock.t))
    clock.t += 6 * MS
    r.stage_started("1", "0")
    clock.t += 125 * MS
    r.audio_chunk("1", "0", 2000)
    clock.t += 50 * MS
    r.finish("stop")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"pipeline tts", "stage 0", "stage 1", "transfer 0->1"}
    root = spans["pipeline tts"]
    assert root.context.trace_id == 0x0af7651916cd43dd8448eb211c80319c and root.parent.span_id == 0xb7ad6b7169203331
    assert all(s.parent.span_id == root.context.span_id for s in spans.values() if s is not root)
    assert (root.end_time - root.start_time) / 1e9 == value(p, "vllm_omni:e2e_request_latency_s_sum")
    assert clock.t - t0 == root.end_time - root.start_time
    tx = spans["transfer 0->1"]
    edge = {"from_stage": "0", "from_replica": "0", "to_stage": "1", "to_replica": "0"}
    assert (tx.events[1].timestamp - tx.events[0].timestamp) / 1e9 == value(p, "vllm_omni:transfer_in_flight_s_sum",
                                                                            **edge)
    assert spans["stage 0"].attributes["otel_llm.pipeline.replica"] == "0"
