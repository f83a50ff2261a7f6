"""vLLM's families that need engine data beyond the core record: waiting requests by reason, the
KV connector's prefix cache, prompt tokens by source, prefill KV tokens, speculative decoding.
Hand-driven engine -> step bytes -> Telemetry -> `vllm` and `otel` expositions and OTLP; the step
record's optional extension (old records decode, a truncated one is a counted drop)."""

import logging
import struct

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families as parse_text

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot, StepRecord
from otel_llm.canonical import instruments as I
from otel_llm.engine.step import (
    HEADER_SIZE, LANE_SIZE, Blocked, ForwardSource, SpecDecodingStats, StepLane, outputs_only_header,
)
from otel_llm.export.metric_producer import to_metrics
from otel_llm.frontend.stat_logger import StatLogger
from tests.harness.prometheus import promtool_check_metrics
from tests.otel_llm.conftest import Harness

S, MS = 1_000_000_000, 1_000_000
TOKENS = I._build_1_2_5(8192)
# (prompt tokens, first scheduling's local hits, its external hits): local_compute / local / external
# = 40/40/20, 50/0/0 (rescheduled after a preemption with 30 hits: ignored, as vLLM), 0/8/2 (hits
# clamped to the prompt), 30/0/0 (vLLM's -1: unknown, read as 0).
REQUESTS = ((100, 40, 20), (50, 0, 0), (10, 8, 5), (30, -1, 0))


def drive(h: Harness) -> list[int]:
    """Four requests through prefill, one preemption, two decode steps with speculative decoding,
    two scheduler snapshots; all finish."""
    rids = [h.tel.arrival(RequestInfo(f"r{i}", prompt, "chat", max_tokens=8)) for i, (prompt, _, _) in
            enumerate(REQUESTS)]
    for rid, (_, local, external) in zip(rids, REQUESTS):
        h.at(S).queued(rid)
        h.at(S + MS).scheduled(rid, local, external)
    h.rec.preempted(rids[1])
    h.rec.snapshot(SchedulerSnapshot(running=3, waiting=5, kv_usage=0.5, waiting_deferred=2,
                                     external_prefix_queries=120, external_prefix_hits=12))
    h.step(S + 2 * MS, S + 3 * MS, prompt_tokens=120)
    h.at(S + 4 * MS).scheduled(rids[1], 30)  # a reschedule: its hits do not count again
    h.rec.outputs(rids, 1)
    h.rec.spec_decode(2, 6, 3, [2, 1, 0])
    h.rec.snapshot(SchedulerSnapshot(running=4, waiting=5, kv_usage=0.5, waiting_deferred=2,
                                     external_prefix_queries=80, external_prefix_hits=10))
    h.step(S + 10 * MS, S + 11 * MS)
    h.rec.outputs(rids, [2, 2, 2, 2])
    h.rec.spec_decode(1, 3, 3, [1, 1, 1])  # two calls in one step add up
    h.rec.spec_decode(1, 3, 0, [0, 0, 0])
    for rid in rids:
        h.rec.finished(rid, FinishReason.STOP)
    h.step(S + 20 * MS, S + 21 * MS)
    return rids


BASE_LABELS = ("model_name", "engine", "gen_ai_request_model", "otel_llm_engine")


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, labels but the base ones) -> value."""
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in BASE_LABELS))): s.value
            for fam in parse_text(text) for s in fam.samples}


def test_vllm_profile_exact_names_types_labels_and_values():
    h = Harness(num_speculative_tokens=3)
    drive(h)
    text = h.tel.render().decode()
    types = {f.name: f.type for f in parse_text(text)}
    got = samples(text)
    assert {n: types[n] for n in (
        "vllm:num_requests_waiting_by_reason", "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits",
        "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached", "vllm:request_prefill_kv_computed_tokens",
        "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos")} == {
        "vllm:num_requests_waiting_by_reason": "gauge", "vllm:external_prefix_cache_queries": "counter",
        "vllm:external_prefix_cache_hits": "counter", "vllm:prompt_tokens_by_source": "counter",
        "vllm:prompt_tokens_cached": "counter", "vllm:request_prefill_kv_computed_tokens": "histogram",
        "vllm:spec_decode_num_drafts": "counter", "vllm:spec_decode_num_draft_tokens": "counter",
        "vllm:spec_decode_num_accepted_tokens": "counter", "vllm:spec_decode_num_accepted_tokens_per_pos": "counter"}
    assert "# HELP vllm:prompt_tokens_cached_total Number of cached prompt tokens (local + external).\n" in text
    assert ("# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason. Reason labels: "
            "'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
            "budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.\n") in text
    assert ("# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.\n"
            in text)
    want = {
        ("vllm:num_requests_waiting", ()): 5,
        ("vllm:num_requests_waiting_by_reason", (("reason", "capacity"),)): 3,
        ("vllm:num_requests_waiting_by_reason", (("reason", "deferred"),)): 2,
        ("vllm:external_prefix_cache_queries_total", ()): 200,
        ("vllm:external_prefix_cache_hits_total", ()): 22,
        ("vllm:prompt_tokens_total", ()): 190,
        ("vllm:prompt_tokens_by_source_total", (("source", "local_compute"),)): 120,
        ("vllm:prompt_tokens_by_source_total", (("source", "local_cache_hit"),)): 48,
        ("vllm:prompt_tokens_by_source_total", (("source", "external_kv_transfer"),)): 22,
        ("vllm:prompt_tokens_cached_total", ()): 70,
        ("vllm:request_prefill_kv_computed_tokens_count", ()): 4,
        ("vllm:request_prefill_kv_computed_tokens_sum", ()): 120,  # 40 + 50 + 0 + 30
        ("vllm:request_prefill_kv_computed_tokens_bucket", (("le", "1.0"),)): 1,
        ("vllm:request_prefill_kv_computed_tokens_bucket", (("le", "20.0"),)): 1,
        ("vllm:request_prefill_kv_computed_tokens_bucket", (("le", "50.0"),)): 4,
        ("vllm:spec_decode_num_drafts_total", ()): 4,
        ("vllm:spec_decode_num_draft_tokens_total", ()): 12,
        ("vllm:spec_decode_num_accepted_tokens_total", ()): 6,
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", "0"),)): 3,
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", "1"),)): 2,
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", "2"),)): 1,
    }
    assert {k: got.get(k) for k in want} == want
    positions = [k for k in got if k[0] == "vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert len(positions) == 3  # 0..k-1, as vLLM pre-creates them
    les = [dict(k[1])["le"] for k in got if k[0] == "vllm:request_prefill_kv_computed_tokens_bucket"]
    assert [float(x) for x in les[:-1]] == list(TOKENS) and les[-1] == "+Inf"  # = vllm:request_prompt_tokens
    # every label set: model_name and engine plus vLLM's own extra label
    for fam in parse_text(text):
        if fam.name.startswith(("vllm:spec_decode", "vllm:prompt_tokens_by", "vllm:num_requests_waiting_by")):
            for s in fam.samples:
                assert set(s.labels) - {"model_name", "engine"} <= {"reason", "source", "position"}
    assert h.counter("otel_llm.telemetry.dropped")[0] == 0
    assert h.tel.table.live_hits == 0  # every request with hits finished: the no-hit fast paths are back


def test_spec_decode_families_only_when_configured_as_vllm_does():
    h = Harness()  # num_speculative_tokens=0: vLLM declares no SpecDecodingProm families
    drive(h)
    assert "vllm:spec_decode" not in h.tel.render().decode()
    assert "otel_llm_spec_decode" not in h.tel.render(profile="otel").decode()  # nor the otel profile
    metrics = {m.name: m for m in to_metrics(h.tel)}  # but the data an engine recorded still goes out over OTLP
    assert metrics["otel_llm.spec_decode.drafts"].data.data_points[0].value == 4
    h = Harness()
    assert not any(m.name.startswith("otel_llm.spec_decode.") for m in to_metrics(h.tel))  # no zero points


def test_otel_profile_values_and_promtool():
    h = Harness(num_speculative_tokens=3)
    drive(h)
    text = h.tel.render(profile="otel").decode()
    got = samples(text)
    want = {
        ("otel_llm_scheduler_waiting_by_reason", (("otel_llm_waiting_reason", "capacity"),)): 3,
        ("otel_llm_scheduler_waiting_by_reason", (("otel_llm_waiting_reason", "deferred"),)): 2,
        ("otel_llm_external_prefix_cache_queries_total", ()): 200,
        ("otel_llm_external_prefix_cache_hits_total", ()): 22,
        ("otel_llm_usage_prompt_tokens_by_source_total", (("otel_llm_prompt_source", "local_compute"),)): 120,
        ("otel_llm_usage_prompt_tokens_by_source_total", (("otel_llm_prompt_source", "local_cache_hit"),)): 48,
        ("otel_llm_usage_prompt_tokens_by_source_total", (("otel_llm_prompt_source", "external_kv_transfer"),)): 22,
        ("otel_llm_usage_prompt_tokens_cached_total", ()): 70,
        ("otel_llm_request_prefill_kv_computed_tokens_sum",
         (("gen_ai_operation_name", "chat"), ("otel_llm_stream", "false"))): 120,
        ("otel_llm_spec_decode_accepted_tokens_per_pos_total", (("otel_llm_spec_decode_position", "1"),)): 2,
    }
    assert {k: got.get(k) for k in want} == want
    assert promtool_check_metrics(text) == []
    findings = promtool_check_metrics(h.tel.render().decode())
    unexplained = [f for f in findings if "should not contain ':'" not in f
                   and f != 'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix']
    assert unexplained == [], unexplained


def test_otlp_carries_the_canonical_instruments():
    h = Harness()
    reader = InMemoryMetricReader()
    h.tel.attach_reader(reader)
    drive(h)
    metrics = {m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics}

    def points(name):
        return {tuple(sorted((k, v) for k, v in p.attributes.items() if k.startswith("otel_llm.")
                             and k != "otel_llm.engine")): p for p in metrics[name].data.data_points}

    waiting = points("otel_llm.scheduler.waiting_by_reason")
    assert {k: p.value for k, p in waiting.items()} == {
        (("otel_llm.waiting_reason", "capacity"),): 3, (("otel_llm.waiting_reason", "deferred"),): 2}
    assert {k: p.value for k, p in points("otel_llm.usage.prompt_tokens_by_source").items()} == {
        (("otel_llm.prompt_source", "local_compute"),): 120, (("otel_llm.prompt_source", "local_cache_hit"),): 48,
        (("otel_llm.prompt_source", "external_kv_transfer"),): 22}
    assert metrics["otel_llm.usage.prompt_tokens_cached"].data.data_points[0].value == 70
    assert metrics["otel_llm.external_prefix_cache.hits"].data.data_points[0].value == 22
    assert metrics["otel_llm.external_prefix_cache.queries"].unit == "{token}"
    kv = metrics["otel_llm.request.prefill_kv_computed_tokens"].data.data_points
    assert [(p.count, p.sum, p.attributes["gen_ai.operation.name"]) for p in kv] == [(4, 120, "chat")]
    assert [metrics[f"otel_llm.spec_decode.{n}"].data.data_points[0].value
            for n in ("drafts", "draft_tokens", "accepted_tokens")] == [4, 12, 6]
    per_pos = points("otel_llm.spec_decode.accepted_tokens_per_pos")
    assert {k[0][1]: p.value for k, p in per_pos.items()} == {"0": 3, "1": 2, "2": 1}  # positions with data


def test_spans_report_local_plus_external_cache_reads():
    h = Harness()
    drive(h)
    reads = sorted(s.attributes["gen_ai.usage.cache_read.input_tokens"] for s in h.exporter.get_finished_spans()
                   if "gen_ai.usage.cache_read.input_tokens" in (s.attributes or {}))
    assert reads == [0, 0, 10, 60]


def test_positions_past_the_bound_and_bad_values_are_counted_drops():
    h = Harness(num_speculative_tokens=2)
    h.rec.spec_decode(1, 17, 17, [1] * 17)  # 17 positions: more than the 16 kept
    h.step(S, S)
    h.tel.ingest(h.rec.end_step()._replace(spec_decoding=SpecDecodingStats(1, 2, 1, np.ones(20, np.int64))))
    h.rec.spec_decode(-1, 2, 1, [1, 0])  # negative: the step's sample is dropped
    h.step(S + MS, S + MS)
    h.rec.spec_decode(1, 2, 1, [1, 0])
    h.step(S + 2 * MS, S + 2 * MS)
    assert h.counter("otel_llm.telemetry.dropped")[0] == 3
    assert h.counter("otel_llm.spec_decode.drafts")[0] == 3  # the totals of the too-long steps count
    assert h.counter("otel_llm.spec_decode.accepted_tokens_per_pos").tolist() == [1] + [0] * 15
    h.rec.snapshot(SchedulerSnapshot(running=1, waiting=1, kv_usage=0.1, waiting_deferred=2))  # deferred > waiting
    h.step(S + 3 * MS, S + 3 * MS)
    assert h.counter("otel_llm.telemetry.dropped")[0] == 4
    assert h.tel.snapshot().gauges["otel_llm.scheduler.waiting_by_reason"] is None


# -- the step record --------------------------------------------------------------------------

def old_format_record() -> bytes:
    """A record as the format was before the extension: header, one event, one output, one finish."""
    header = struct.pack("<IHHqqqqIIIiidqqq", 0x4C4C4F54, 1, 1 | 2, 7, 8, 9, 10, 1, 1, 1, 3, 4, 0.5, 11, 12, 13)
    return header + struct.pack("<qqqB", 42, 5, 16, 2) + struct.pack("<q", 42) + struct.pack("<qiB", 42, 0, 1)


def test_old_records_decode_and_records_without_new_data_keep_the_old_bytes():
    data = old_format_record()
    rec = StepRecord.from_bytes(data)
    assert rec.snapshot == SchedulerSnapshot(3, 4, 0.5, 11, 12, 13)
    assert rec.event_value.tolist() == [16] and rec.finished_reason.tolist() == [1]
    assert rec.spec_decoding is None and rec.event_external is None
    assert rec.to_bytes() == data  # nothing new: byte for byte the old format


def test_round_trip_with_the_extension():
    h = Harness()
    h.rec.scheduled(5, 3, 7)
    h.rec.scheduled(6, 2)
    h.rec.outputs([5], 1)
    h.rec.spec_decode(2, 4, 3, [2, 1])
    h.rec.snapshot(SchedulerSnapshot(1, 6, 0.2, 10, 5, 0, waiting_deferred=4, external_prefix_queries=9,
                                     external_prefix_hits=3))
    data = h.rec.end_step_bytes(0)
    assert struct.unpack_from("<H", data, 6)[0] & 4
    assert outputs_only_header(data) is None  # a record with the extension never takes the steady path
    rec = StepRecord.from_bytes(data)
    assert rec.event_external.tolist() == [7, 0] and rec.event_value.tolist() == [3, 2]
    assert rec.spec_decoding[:3] == (2, 4, 3) and rec.spec_decoding.accepted_per_pos.tolist() == [2, 1]
    assert rec.snapshot == SchedulerSnapshot(1, 6, 0.2, 10, 5, 0, 4, 9, 3)
    assert rec.to_bytes() == data
    h.rec.outputs([5], 1)
    steady = h.rec.end_step_bytes(0)
    assert outputs_only_header(steady) is not None and len(steady) == HEADER_SIZE + 8  # unchanged


LANE = StepLane(6 * 10**9, 900_000, 0, 3, 3, 3, 2, 0, 0.25, 10**12, 5 * 10**8, 10**6, Blocked.SLOTS,
                ForwardSource.HOST)


@pytest.mark.parametrize("lane", [None, LANE])
@pytest.mark.parametrize("prompt_tokens", [0, 300])
def test_the_steady_step_is_encoded_as_its_record_would_be(prompt_tokens, lane):
    """`end_step_bytes` encodes a step of single-token outputs without building a record: the same bytes,
    with or without the step's lane (then right after the header: the body still ends in the rids)."""
    h = Harness()
    for _ in range(2):
        h.at(7 * 10**9).outputs([11, 12 << 32 | 3, 13], [1, 1, 1])
        if lane is not None:
            h.rec.lane(lane)
        data = h.rec.end_step_bytes(prompt_tokens)
    h.at(7 * 10**9).outputs([11, 12 << 32 | 3, 13], [1, 1, 1])
    h.rec.snapshot(SchedulerSnapshot(3, 0, 0.1, 0, 0, 0))  # a snapshot: the record path
    if lane is not None:
        h.rec.lane(lane)
    rec = StepRecord.from_bytes(h.rec.end_step_bytes(prompt_tokens))._replace(snapshot=None)
    body = HEADER_SIZE + (LANE_SIZE if lane else 0)
    assert data == rec.to_bytes() and outputs_only_header(data) == (7 * 10**9, h.rec.anchor_wall_ns,
                                                                    h.rec.anchor_mono_ns, prompt_tokens, body)
    decoded = StepRecord.from_bytes(data)
    assert decoded.output_rid.tolist() == [11, 12 << 32 | 3, 13] and decoded.lane == lane
    assert len(data) == body + 3 * 8


def test_a_truncated_or_malformed_extension_is_a_counted_drop():
    h = Harness()
    h.rec.spec_decode(1, 2, 1, [1, 0])
    data = h.rec.end_step_bytes(0)
    for bad in (data[:-1], data[:-8], data[:HEADER_SIZE + 10], data + b"\0" * 8):
        with pytest.raises(ValueError):
            StepRecord.from_bytes(bad)
        h.tel.ingest(bad)
    parts = bytearray(data)
    parts[HEADER_SIZE + 44] = 0x80  # an unknown extension part
    with pytest.raises(ValueError):
        StepRecord.from_bytes(bytes(parts))
    h.tel.ingest(bytes(parts))
    assert h.counter("otel_llm.telemetry.dropped")[0] == 5
    assert h.counter("otel_llm.spec_decode.drafts")[0] == 0
    h.tel.ingest(data)
    assert h.counter("otel_llm.spec_decode.drafts")[0] == 1


# -- the log lines ----------------------------------------------------------------------------

def test_log_lines_as_vllm(caplog):
    h = Harness(num_speculative_tokens=3)
    logger = StatLogger(h.tel, 10.0, start_thread=False)
    caplog.set_level(logging.DEBUG, "otel_llm.stats")
    drive(h)
    line = logger.log()
    assert ", Waiting: 5 reqs, Deferred: 2 reqs, GPU KV cache usage: 50.0%, " in line
    assert line.endswith("Prefix cache hit rate: 0.0%, External prefix cache hit rate: 11.0%")
    spec = caplog.records[-1].getMessage()
    assert spec.startswith("SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: ")
    assert spec.endswith("Accepted: 6 tokens, Drafted: 12 tokens, Per-position acceptance rate: 0.750, 0.500, 0.250, "
                         "Avg Draft acceptance rate: 50.0%")
    h.rec.snapshot(SchedulerSnapshot(running=0, waiting=1, kv_usage=0.0))
    h.step(S + 30 * MS, S + 30 * MS)
    line = logger.log()
    assert "Deferred" not in line and "External prefix cache hit rate: 11.0%" in line  # still in the window
    assert not caplog.records[-1].getMessage().startswith("SpecDecoding")  # no drafts this interval


# -- the vLLM plugin path ---------------------------------------------------------------------

def test_vllm_stats_objects_feed_the_same_canonical_instruments():
    from types import SimpleNamespace as NS

    from otel_llm.vllm.stats import VllmStatsAggregator

    agg = VllmStatsAggregator("m", 8192, vllm_families=False)  # `add` mode: OTLP only

    def sched(deferred, spec, connector):
        return NS(num_running_reqs=1, num_waiting_reqs=3, num_skipped_waiting_reqs=deferred, kv_cache_usage=0.1,
                  prefix_cache_stats=NS(queries=0, hits=0), connector_prefix_cache_stats=connector,
                  spec_decoding_stats=spec)

    def spec(pos):
        return NS(num_drafts=2, num_draft_tokens=2 * len(pos), num_accepted_tokens=sum(pos),
                  num_accepted_tokens_per_pos=pos)

    agg.record(sched(0, spec([2, 1, 0]), NS(queries=50, hits=20, hits_by_source={})), None)
    agg.record(sched(2, spec([1] * 17), None), None)  # 17 positions: left out, counted
    agg.record(sched(2, None, NS(queries=10, hits=0, hits_by_source={})), None)
    snap = agg.engines[0].snapshot()
    c = snap.counters
    assert [c[f"otel_llm.spec_decode.{n}"][0] for n in ("drafts", "draft_tokens", "accepted_tokens")] == [4, 40, 20]
    assert c["otel_llm.spec_decode.accepted_tokens_per_pos"].tolist() == [2, 1] + [0] * 14
    assert c["otel_llm.telemetry.dropped"][0] == 1
    assert (c["otel_llm.external_prefix_cache.queries"][0], c["otel_llm.external_prefix_cache.hits"][0]) == (60, 20)
    assert snap.gauges["otel_llm.scheduler.waiting_by_reason"].tolist() == [3, 2]
