"""Several engines on one /metrics under a profile whose names have no engine label (SGLang, TGI,
Triton): one series each, the engines' values merged (counts and histograms add up, count gauges
add up, ratios average); under vllm and otel each engine keeps its own series."""

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot, Telemetry, TelemetryConfig
from otel_llm.engine.recorder import StepRecorder
from otel_llm.export.exposition import Renderer
from otel_llm.shim.profiles import PROFILE_NAMES, get_profile


def engine(name: str, kv_usage: float, requests: int) -> Telemetry:
    tel = Telemetry(TelemetryConfig("m", engine=name, log_stats=False, tracing=False))
    rec = StepRecorder()
    for i in range(requests):
        rid = tel.arrival(RequestInfo(f"{name}-{i}", 10, "chat", max_tokens=4))
        rec.queued(rid)
        rec.scheduled(rid)
        rec.outputs([rid])
        rec.finished(rid, FinishReason.STOP)
    rec.snapshot(SchedulerSnapshot(running=2, waiting=3, kv_usage=kv_usage))
    tel.ingest(rec.end_step_bytes(10 * requests))
    return tel


def series(text: str) -> dict:
    out = {}
    for fam in parse_text(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"{key} written twice"
            out[key] = s.value
    return out


def value(samples: dict, name: str) -> float:
    # the parser reads a counter written without `_total` (TGI, Triton) as `<name>_total`
    (v,) = [v for (n, _), v in samples.items() if n in (name, name + "_total")]
    return v


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_each_series_once_and_merged_values(profile):
    tels = [engine("0", 0.5, 1), engine("1", 0.25, 2)]
    renderer = Renderer(get_profile(profile))
    got = series(renderer.render([t.source() for t in tels]).decode())
    if profile == "triton":
        assert value(got, "nv_inference_request_success") == 3
        assert value(got, "nv_inference_pending_request_count") == 6
        assert sum(v for (n, lab), v in got.items() if n == "nv_trt_llm_kv_cache_block_metrics"
                   and ("kv_cache_block_type", "fraction") in lab) == 0.375
    elif profile == "tgi":
        assert value(got, "tgi_request_success") == 3 and value(got, "tgi_queue_size") == 6
    elif profile == "sglang":
        assert value(got, "sglang:num_running_reqs") == 4 and value(got, "sglang:token_usage") == 0.375
    else:  # one series per engine
        running = "vllm:num_requests_running" if profile == "vllm" else "otel_llm_scheduler_running"
        assert sorted(v for (n, _), v in got.items() if n == running) == [2, 2]
    for _ in range(3):  # the merged source keeps a stable cache key: no growth per scrape
        renderer.render([t.source() for t in tels])
    size = len(renderer._cache)
    renderer.render([t.source() for t in tels])
    assert len(renderer._cache) == size
