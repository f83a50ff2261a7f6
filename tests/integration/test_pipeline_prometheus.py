"""A real Prometheus scrapes a two-stage, two-replica pipeline's `/metrics` (stage `vllm:*` families
reshaped to stage/replica, plus the `vllm_omni:*` families); promtool lints the exposition."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot, StepRecorder, Telemetry, TelemetryConfig
from otel_llm.export.asgi import make_metrics_app
from otel_llm.pipeline import PipelineConfig, PipelineTelemetry, TransferHop
from tests.harness.ports import free_port
from tests.harness.prometheus import PrometheusServer, promtool_check_metrics

STAGES = [(s, r) for s in ("0", "1") for r in ("0", "1")]
MS = 1_000_000

# promtool findings the vLLM / vLLM-Omni names cause, each accepted on purpose:
ACCEPTED = (
    "should not contain ':'",  # every vllm:* and vllm_omni:* name (recording-rule syntax, vLLM's choice)
    'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix',  # vLLM's histogram name
    "metric names should not contain abbreviated units",  # vLLM-Omni's `_s` suffix on its time families
)


def workload(tels: list[Telemetry], pipeline: PipelineTelemetry) -> None:
    for i, tel in enumerate(tels):
        rec = StepRecorder()
        handle = tel.arrival(RequestInfo(request_id=f"a{i}", prompt_tokens=4))
        rec.queued(handle)
        rec.scheduled(handle)
        rec.outputs([handle], 1)
        rec.finished(handle, FinishReason.STOP)
        rec.snapshot(SchedulerSnapshot(running=i + 1, waiting=0, kv_usage=0.25))
        tel.ingest(rec.end_step_bytes())
    for i in range(4):
        req = pipeline.arrival(f"r{i}", audio=True)
        replica = str(i % 2)
        req.stage_started("0", replica)
        req.stage_finished("0", replica)
        now = time.monotonic_ns()
        req.transfer(TransferHop("0", replica, "1", replica, 40000, now, now + MS, now + 3 * MS, now + 4 * MS))
        req.stage_started("1", replica)
        req.audio_chunk("1", replica, 4800)
        req.audio_chunk("1", replica, 4800)
        if i == 3:
            req.abort()
        else:
            req.finish("stop")


@pytest.fixture
def served():
    tels = [Telemetry(TelemetryConfig("tts", log_stats=False, tracing=False, stage_replica=sr)) for sr in STAGES]
    pipeline = PipelineTelemetry(PipelineConfig("tts"))
    workload(tels, pipeline)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_metrics_app(tels, extra=pipeline.render), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.slow
def test_prometheus_scrapes_the_pipeline_and_promtool_accepts_it(served):
    port = served
    with PrometheusServer(f"127.0.0.1:{port}") as prom:
        prom.wait_for_scrapes(2, timeout_s=30)
        assert prom.value('vllm_omni:requests_success_total{finished_reason="stop"}') == 3
        assert prom.value('vllm_omni:requests_success_total{finished_reason="abort"}') == 1
        assert prom.value('vllm_omni:requests_failed_total{reason="client_disconnect"}') == 1
        assert prom.value("vllm_omni:e2e_request_latency_s_count") == 3  # the completed ones
        assert prom.value('sum(vllm_omni:stage_gen_time_s_count{stage="0",stage_type="llm"})') == 4
        assert prom.value("sum(vllm_omni:transfer_size_bytes_count)") == 4
        assert len(prom.query("vllm_omni:transfer_tx_s_count")) == 2  # two edges: 0/0->1/0, 0/1->1/1
        assert prom.value("sum(vllm_omni:audio_frames_total)") == 3 * 4800
        assert prom.value('vllm:num_requests_running{stage="1",replica="1"}') == 4
        assert len(prom.query("vllm:num_requests_running")) == 4
        assert prom.query('vllm:num_requests_running{engine!=""}') == []
        p50 = prom.value("histogram_quantile(0.5, sum by (le) (vllm_omni:transfer_size_bytes_bucket))")
        assert 16384 < p50 <= 65536
    for accept in ("", "application/openmetrics-text; version=1.0.0"):
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"accept": accept}).text
        if not accept:
            unexplained = [f for f in promtool_check_metrics(text) if not any(a in f for a in ACCEPTED)]
            assert unexplained == [], unexplained
        assert "vllm_omni:audio_continuity_ok" in text
