"""Bad input never raises into the caller: it is dropped and counted. Bad config fails loudly."""

import math

import numpy as np
import pytest

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot, StepRecord, TelemetryConfig
from tests.otel_llm.frontend.test_request_table import MS, S


@pytest.fixture
def h(h_any):
    """Every test here in both ways finished requests are folded (conftest.h_any)."""
    return h_any


def test_unknown_ids_garbage_bytes_and_bad_values_are_counted(h):
    rid = h.tel.arrival(RequestInfo("r", 3, "chat"))
    h.at(S).queued(123456789)  # unknown
    h.at(S).outputs([rid, -5, 1 << 40], [1, 1, 1])
    h.at(S).outputs([rid], [0])  # a zero-token output
    h.rec.snapshot(SchedulerSnapshot(1, 0, math.nan))
    h.step(S, S)
    h.tel.ingest(b"garbage")
    h.tel.ingest(b"\x00" * 200)
    d = h.dropped()
    assert d["unknown_request"] == 3 and d["bad_value"] == 4
    assert h.tel.snapshot().counters["otel_llm.telemetry.dropped"][0] == 7
    assert h.tel.snapshot().gauges["otel_llm.kv_cache.usage"] is None


def test_an_event_kind_that_does_not_exist_is_a_counted_drop(h):
    rid = h.tel.arrival(RequestInfo("r", 3, "chat"))
    h.at(S)._event(rid, 7)  # not QUEUED, SCHEDULED or PREEMPTED (a newer or broken engine)
    h.at(S).queued(rid)
    h.at(S + 10 * MS).scheduled(rid)
    h.at(S + 20 * MS).outputs([rid], 1)
    h.rec.finished(rid, FinishReason.STOP)
    h.step(S + 20 * MS, S + 20 * MS)
    assert h.dropped()["bad_value"] == 1
    assert h.hist("otel_llm.request.queue.duration").sums.sum() == 10 * MS * 1e-9  # the others still count


def test_out_of_order_events_do_not_poison_intervals(h):
    rid = h.tel.arrival(RequestInfo("r", 3, "chat"))
    h.at(2 * S).outputs([rid], 1)  # a token before QUEUED/SCHEDULED were ever seen
    h.rec.finished(rid, FinishReason.STOP)
    h.step(2 * S, 2 * S)
    assert h.dropped()["out_of_order"] == 1
    assert h.hist("otel_llm.request.prefill.duration").counts.sum() == 0
    assert h.counter("otel_llm.request.finished").sum() == 1  # still counted as finished


def test_frontend_failure_finishes_a_request(h):
    rid = h.tel.arrival(RequestInfo("r", 3, "chat"))
    h.tel.fail(rid, FinishReason.ERROR)
    h.tel.fail(rid, FinishReason.ERROR)  # twice: the second is an unknown handle
    assert h.counter("otel_llm.request.finished").reshape(-1, 4)[:, FinishReason.ERROR].sum() == 1
    assert h.dropped()["unknown_request"] == 1


def test_malformed_step_record_is_rejected_by_the_decoder():
    with pytest.raises(ValueError, match="too short"):
        StepRecord.from_bytes(b"abc")


@pytest.mark.parametrize("kwargs, bad", [({"model_name": ""}, "model_name"),
                                         ({"model_name": "m", "metrics_compat": "nvidia"}, "metrics_compat"),
                                         ({"model_name": "m", "log_stats_interval_s": 0}, "log_stats_interval_s"),
                                         ({"model_name": "m", "max_model_len": -1}, "max_model_len")])
def test_bad_config_names_the_value(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        TelemetryConfig(**kwargs)


def test_step_record_round_trip():
    from otel_llm import StepRecorder
    rec = StepRecorder()
    rec.queued(5)
    rec.scheduled(5, 16)
    rec.outputs(np.array([5, 6]), [1, 3])
    rec.finished(6, FinishReason.LENGTH, 2)
    rec.snapshot(SchedulerSnapshot(2, 1, 0.25, 32, 16, 1))
    back = StepRecord.from_bytes(rec.end_step_bytes(40))
    assert back.event_kind.tolist() == [1, 2] and back.event_value.tolist() == [0, 16]
    assert back.output_num_tokens.tolist() == [1, 3] and not back.outputs_all_one
    assert back.finished_reason.tolist() == [1] and back.finished_max_seq_tokens.tolist() == [2]
    assert back.snapshot == SchedulerSnapshot(2, 1, 0.25, 32, 16, 1) and back.num_computed_prompt_tokens == 40


@pytest.mark.parametrize("counts,all_one", [([1, 1, 1], True), ((1, 1, 1), True), ([1, 1, 2], False),
                                            ([1, 1], False), (np.ones(3, np.int32), True), (1, True), (2, False)])
def test_outputs_counts_given_any_way(counts, all_one):
    """Per-request counts as a list, a tuple, an array or one int: the same record; all ones keeps the
    frontend's steady-decode flag (a list of ones takes no array work); a wrong length is refused."""
    from otel_llm import StepRecorder
    rec = StepRecorder()
    if isinstance(counts, list) and len(counts) != 3:
        with pytest.raises(ValueError):
            rec.outputs([7, 8, 9], counts)
        return
    rec.outputs([7, 8, 9], counts)
    back = StepRecord.from_bytes(rec.end_step_bytes())
    expected = [counts] * 3 if isinstance(counts, int) else list(counts)
    assert back.output_rid.tolist() == [7, 8, 9] and back.output_num_tokens.tolist() == expected
    assert back.outputs_all_one is all_one


def test_public_surface_is_pinned():
    import otel_llm
    assert sorted(otel_llm.__all__) == ["EventKind", "FinishReason", "RequestInfo", "SchedulerSnapshot",
                                        "StepRecord", "StepRecorder", "Telemetry", "TelemetryConfig"]
