"""Stage/replica reshape: a stage's `vllm:*` families carry `stage`/`replica`, several stages on one `/metrics`."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot, StepRecorder, Telemetry, TelemetryConfig
from otel_llm.export.asgi import make_metrics_app
from otel_llm.pipeline.telemetry import PipelineConfig, PipelineTelemetry
from otel_llm.shim.profiles import get_profile

STAGES = [(s, r) for s in ("0", "1") for r in ("0", "1")]


def stage_telemetry(stage: str, replica: str, **config) -> Telemetry:
    return Telemetry(TelemetryConfig("tts", log_stats=False, tracing=False, stage_replica=(stage, replica), **config))


def scrape(app, openmetrics: bool = False) -> str:
    headers = {"accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return (await c.get("/metrics", headers=headers)).text

    return asyncio.run(go())


def one_request(tel: Telemetry, running: int) -> None:
    rec = StepRecorder()
    handle = tel.arrival(RequestInfo(request_id="a", prompt_tokens=4))
    rec.queued(handle)
    rec.scheduled(handle)
    rec.outputs([handle], 1)
    rec.finished(handle, FinishReason.LENGTH)
    rec.snapshot(SchedulerSnapshot(running=running, waiting=0, kv_usage=0.5))
    tel.ingest(rec.end_step_bytes())


def test_stage_telemetry_families_carry_stage_and_replica_not_engine():
    tel = stage_telemetry("1", "0")
    one_request(tel, running=3)
    families = list(text_string_to_metric_families(tel.render().decode()))
    labelled = [s for f in families if f.name.startswith("vllm:") for s in f.samples
                if f.name != "vllm:admission_rejections"]
    assert labelled and all(s.labels["stage"] == "1" and s.labels["replica"] == "0" and "engine" not in s.labels
                            for s in labelled)
    assert tel.config.profile().base_labels == (("model_name", "model"), ("stage", "stage"), ("replica", "replica"))


def test_two_stages_two_replicas_and_the_pipeline_on_one_exposition():
    tels = [stage_telemetry(s, r) for s, r in STAGES]
    for i, tel in enumerate(tels):
        one_request(tel, running=i + 1)
    pipeline = PipelineTelemetry(PipelineConfig("tts"))
    pipeline.arrival("r").finish()
    app = make_metrics_app(tels, extra=pipeline.render)
    text = scrape(app)
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names))  # each family once: nothing registered twice
    running = {(s.labels["stage"], s.labels["replica"]): s.value
               for f in families if f.name == "vllm:num_requests_running" for s in f.samples}
    assert running == {sr: i + 1 for i, sr in enumerate(STAGES)}
    success = [s for f in families if f.name == "vllm:request_success" for s in f.samples
               if s.labels["finished_reason"] == "length"]
    assert sorted((s.labels["stage"], s.labels["replica"], s.value) for s in success) == [(*sr, 1) for sr in STAGES]
    assert "vllm_omni:requests_success" in names and "vllm_omni:e2e_request_latency_s" in names
    om = [f.name for f in parse_openmetrics(scrape(app, openmetrics=True))]
    assert len(om) == len(set(om)) and "vllm_omni:requests_success" in om


def test_cache_config_info_carries_stage_and_replica():
    tel = stage_telemetry("0", "1", cache_config={"block_size": 16})
    info = [s for f in text_string_to_metric_families(tel.render().decode()) if f.name == "vllm:cache_config_info"
            for s in f.samples]
    assert info and info[0].labels["stage"] == "0" and info[0].labels["replica"] == "1"
    assert "engine" not in info[0].labels


def test_unstaged_profile_is_unchanged_and_get_profile_offers_the_option():
    assert get_profile("vllm").base_labels == (("model_name", "model"), ("engine", "engine"))
    assert get_profile("vllm", stage_replica=True).base_labels[1:] == (("stage", "stage"), ("replica", "replica"))
    assert "engine=\"0\"" in Telemetry(TelemetryConfig("m", log_stats=False, tracing=False)).render().decode()


@pytest.mark.parametrize("bad", [("0",), ("0", ""), ("0", 1), "01"])
def test_invalid_stage_replica_raises_at_startup(bad):
    with pytest.raises(ValueError, match="stage_replica"):
        Telemetry(TelemetryConfig("m", stage_replica=bad))


def test_stats_off_exposition_is_as_small_as_a_disabled_telemetry():
    """vLLM-Omni's --log-stats off: no omni family at all (not empty series), no vllm:* family."""
    baseline = make_metrics_app([Telemetry(TelemetryConfig("tts", enabled=False))])
    off = [stage_telemetry(s, r, enabled=False) for s, r in STAGES]
    pipeline = PipelineTelemetry(PipelineConfig("tts", enabled=False))
    r = pipeline.arrival("r", audio=True)
    r.audio_chunk("1", "0", 2000)
    r.finish()
    app = make_metrics_app(off, extra=pipeline.render)
    for openmetrics in (False, True):
        body = scrape(app, openmetrics)
        assert body == scrape(baseline, openmetrics) and "omni" not in body
