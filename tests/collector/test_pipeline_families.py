"""A pipeline's families through OTLP: the SDK's exporter carries them as OTel instruments, and the
collector serves each sample the pipeline's own `/metrics` serves, under vLLM-Omni's names (the
`vllm` profile) or the OTel names (`otel`), equal; a real `serve-pipeline` pushing to it too."""

from __future__ import annotations

import httpx
import openai
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from otel_llm.export.metric_producer import attach_reader
from otel_llm.pipeline import PipelineConfig, PipelineTelemetry, TransferHop
from otel_llm.pipeline.families import FAMILIES
from prometheus_client.parser import text_string_to_metric_families

from tests.collector.test_collector_e2e import new_collector, scrape
from tests.server.api.api_server_harness import ServerProcess, wait_until

MS = 1_000_000
RESOURCE = {"service.name": "tts", "service.instance.id": "tts-1"}


def samples(text: str, prefix: str = "") -> dict[tuple, float]:
    """(sample name, labels but job and instance) -> value, of the families named `prefix`..."""
    return {(s.name, frozenset((k, v) for k, v in s.labels.items() if k not in ("job", "instance"))): s.value
            for f in text_string_to_metric_families(text) if f.name.startswith(prefix) for s in f.samples}


def busy_pipeline(**config) -> PipelineTelemetry:
    """Every family of a speech pipeline with data, an overflowing one included."""
    p = PipelineTelemetry(PipelineConfig("tts", cardinality_limit=3, **config))
    for i, outcome in enumerate(("stop", "length", "stage_error", "client_disconnect", "stop")):
        r = p.arrival(f"r{i}", audio=True)
        r.stage_started("0", "0")
        r.stage_finished("0", "0")
        t = p.clock()
        r.transfer(TransferHop("0", "0", "1", str(i), 4000 + i, t, t + MS, t + 2 * MS, t + 3 * MS))  # 5 edges
        r.stage_started("1", str(i % 2), queued_ns=t)
        r.audio_chunk("1", str(i % 2), 4800 * (i % 3))  # an empty response is a skipped one
        r.stage_finished("1", str(i % 2))
        if outcome.startswith(("stage", "client")):
            r.fail(outcome)
        else:
            r.finish(outcome, prompt_tokens=7, generation_tokens=3 + i)
    p.stage_waiting("0", "0", 2)
    p.stream_completed()
    p.stream_aborted("closed")
    return p


def pushed(collector, pipeline: PipelineTelemetry) -> None:
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{collector.http.endpoint}/v1/metrics"),
                                           export_interval_millis=3_600_000)
    attach_reader(reader, [], Resource.create(RESOURCE), producers=[pipeline.to_metrics])
    reader.collect()
    reader.shutdown()


@pytest.mark.parametrize("profile", ["vllm", "otel"])
def test_the_collector_serves_every_pipeline_sample_the_pipeline_serves(profile):
    pipeline = busy_pipeline()
    text = pipeline.render(profile=profile).decode()
    assert len(list(text_string_to_metric_families(text))) == len(FAMILIES)  # every family has data
    own = samples(text)
    assert any(("otel_metric_overflow", "true") in labels for _, labels in own)
    with new_collector(profile) as collector:
        pushed(collector, pipeline)
        served = samples(scrape(collector), "vllm_omni:" if profile == "vllm" else "otel_llm_pipeline")
    assert served == own  # the families' own labels only (no otel_scope_*), and job and instance


def test_the_collectors_help_and_types_are_the_families():
    pipeline = busy_pipeline()
    with new_collector("vllm") as collector:
        pushed(collector, pipeline)
        text = scrape(collector)
    for fam in FAMILIES:
        name = "vllm_omni:" + fam.stem
        assert f"# HELP {name}" in text and f"# TYPE {name}" in text, name
        assert f"# TYPE {name}{'_total' if fam.kind.value == 'counter' else ''} {fam.kind.value}" in text


@pytest.mark.slow
def test_a_real_serve_pipeline_reaches_the_collector_under_vllm_omni_names():
    with new_collector("vllm") as collector:
        server = ServerProcess("--otlp-metrics-endpoint", collector.http.endpoint, command="serve-pipeline",
                               env={"OTEL_METRIC_EXPORT_INTERVAL": "300"}).start()
        try:
            with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
                for i in range(3):
                    client.chat.completions.create(
                        model="dummy", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=4,
                        extra_body={"ignore_eos": True, "modalities": ["text", "audio"],
                                    "audio": {"voice": "alloy", "format": "pcm16"}})
            own = samples(httpx.get(f"{server.url}/metrics", timeout=10).text, "vllm_omni:")
            success = ("vllm_omni:requests_success_total",
                       frozenset({"model_name": "dummy", "finished_reason": "length"}.items()))
            assert own[success] == 3 and len(own) > 40

            def differ():  # the server's samples the collector does not serve equal
                served = samples(scrape(collector), "vllm_omni:")
                return {k: (v, served.get(k)) for k, v in own.items() if served.get(k) != v}
            assert wait_until(lambda: not differ(), timeout_s=30), differ()
        finally:
            server.stop()
