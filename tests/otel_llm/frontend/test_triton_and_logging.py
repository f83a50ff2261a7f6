"""Triton statistics (seed 002 schema) and the vLLM-format periodic log line."""

import logging

import pytest

from otel_llm import FinishReason, RequestInfo
from otel_llm.frontend.stat_logger import StatLogger
from otel_llm.frontend.triton_stats import UnknownModel, statistics_response
from tests.otel_llm.export.test_exposition import workload
from tests.otel_llm.frontend.test_request_table import MS, run_timeline


@pytest.fixture
def h(h_any):
    """Every test here in both ways finished requests are folded (conftest.h_any)."""
    return h_any

DURATION_KEYS = {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"}


def test_model_stat_schema_and_values(h):
    run_timeline(h)
    st = h.tel.model_statistics()
    assert set(st) == {"name", "version", "last_inference", "inference_count", "execution_count",
                       "inference_stats", "response_stats", "batch_stats", "memory_usage"}
    assert st["inference_count"] == 1 and st["execution_count"] == 4
    assert set(st["inference_stats"]) == DURATION_KEYS
    assert st["inference_stats"]["queue"] == {"count": 1, "ns": 10 * MS}
    assert st["inference_stats"]["compute_input"] == {"count": 1, "ns": 20 * MS}
    assert st["inference_stats"]["compute_infer"] == {"count": 1, "ns": 15 * MS}
    assert st["inference_stats"]["success"] == {"count": 1, "ns": 55 * MS}
    assert set(st["response_stats"]) == {"0", "1", "2", "3"}
    assert st["response_stats"]["0"]["compute_infer"] == {"count": 1, "ns": 20 * MS}
    assert set(st["response_stats"]["1"]) == {"compute_infer", "compute_output", "success", "fail", "empty_response", "cancel"}
    assert st["batch_stats"][0]["batch_size"] == 1 and st["batch_stats"][0]["compute_infer"]["count"] == 4


@pytest.mark.parametrize("reason, ok", [(FinishReason.REPETITION, True), (FinishReason.LENGTH, True),
                                        (FinishReason.ABORT, False), (FinishReason.ERROR, False)])
def test_success_and_failure_as_the_profiles_count_them(h, reason, ok):
    """REPETITION is a success (vLLM counts it in request_success), as in the `triton` profile."""
    h.fclock.t = MS
    rid = h.tel.arrival(RequestInfo("r", 4))
    h.at(MS).queued(rid)
    h.at(2 * MS).scheduled(rid, 0)
    h.at(3 * MS).outputs([rid], 1)
    h.rec.finished(rid, reason)
    h.step(3 * MS, 4 * MS, prompt_tokens=4)
    stats = h.tel.model_statistics()["inference_stats"]
    assert (stats["success"]["count"], stats["fail"]["count"]) == ((1, 0) if ok else (0, 1))
    text = h.tel.render(profile="triton").decode()
    success = 'nv_inference_request_success{model="m",version="1"} '
    assert f"{success}{1.0 if ok else 0.0}" in text


def test_statistics_response_filters_and_errors(h):
    workload(h)
    assert [m["name"] for m in statistics_response([h.tel])["model_stats"]] == ["m"]
    assert statistics_response([h.tel], "m", "1")["model_stats"][0]["inference_count"] == 5
    with pytest.raises(UnknownModel, match="nope"):
        statistics_response([h.tel], "nope")
    with pytest.raises(UnknownModel, match="version '7'"):
        statistics_response([h.tel], "m", "7")
    with pytest.raises(UnknownModel) as unknown:  # a client's 1 MB name is not sent back in full
        statistics_response([h.tel], "x" * 1_000_000)
    assert str(unknown.value) == f"requested model '{'x' * 100}...' is not available"


def test_log_line_format_and_idle_silence(h, caplog):
    logger = StatLogger(h.tel, 10.0, start_thread=False)
    caplog.set_level(logging.DEBUG, "otel_llm.stats")
    workload(h)
    line = logger.log()
    assert line.startswith("Engine 000: Avg prompt throughput: ") and "Running: 0 reqs, Waiting: 0 reqs" in line
    assert "GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%" in line
    assert caplog.records[-1].levelno == logging.INFO
    logger.log()  # throughput 0 now, but the previous interval was busy: still INFO
    assert caplog.records[-1].levelno == logging.INFO
    logger.log()  # idle twice: DEBUG
    assert caplog.records[-1].levelno == logging.DEBUG
