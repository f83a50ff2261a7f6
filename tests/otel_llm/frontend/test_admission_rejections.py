"""`Telemetry.reject`: vLLM's `vllm:admission_rejections{model_name, reason}` (no engine label, both reasons
pre-created at 0, vLLM's HELP), the `otel` profile's canonical family and the OTLP points; an unknown
reason is dropped and counted, never raised; with telemetry off, nothing."""

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_llm import Telemetry, TelemetryConfig
from otel_llm.export.exposition import Renderer
from tests.collector.otlp_builders import samples

HELP = "Number of admission attempts rejected by a queue limit, by reason."


def _rejected_three_times(engine: str = "0") -> Telemetry:
    tel = Telemetry(TelemetryConfig(model_name="m", engine=engine, log_stats=False))
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens", "max_num_queued_reqs"):
        tel.reject(reason)
    return tel


def test_vllm_profile_as_vllm_writes_it():
    tel = Telemetry(TelemetryConfig(model_name="m", log_stats=False))
    text = tel.render().decode()
    assert f"# HELP vllm:admission_rejections_total {HELP}\n# TYPE vllm:admission_rejections_total counter\n" in text
    assert samples(text)['vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"}'] == 0
    assert samples(text)['vllm:admission_rejections_total{model_name="m",reason="max_num_queued_tokens"}'] == 0
    got = samples(_rejected_three_times().render().decode())
    assert {k: v for k, v in got.items() if "admission" in k} == {
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"}': 2.0,
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_tokens"}': 1.0,
    }
    om = _rejected_three_times().render(openmetrics=True).decode()
    assert "# TYPE vllm:admission_rejections counter" in om
    assert 'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 2.0' in om


def test_sources_the_family_cannot_tell_apart_are_summed():
    a, b = _rejected_three_times("0"), _rejected_three_times("1")
    text = Renderer(a.config.profile("vllm")).render([a.source(), b.source()]).decode()
    assert [line for line in text.splitlines() if line.startswith("vllm:admission")] == [
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 4.0',
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_tokens"} 2.0',
    ]
    assert 'vllm:request_success_total{model_name="m",engine="1",finished_reason="stop"} 0.0' in text  # others keep it


def test_otel_profile_and_otlp():
    tel = _rejected_three_times()
    got = samples(tel.render(profile="otel").decode())
    base = 'gen_ai_request_model="m",otel_llm_engine="0"'
    assert got[f'otel_llm_admission_rejections_total{{{base},otel_llm_rejection_reason="max_num_queued_reqs"}}'] == 2
    assert got[f'otel_llm_admission_rejections_total{{{base},otel_llm_rejection_reason="max_num_queued_tokens"}}'] == 1
    reader = InMemoryMetricReader()
    tel.attach_reader(reader)
    [metric] = [m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name == "otel_llm.admission.rejections"]
    assert metric.description == HELP and metric.unit == "{request}" and metric.data.is_monotonic
    points = {p.attributes["otel_llm.rejection_reason"]: (p.value, p.attributes["gen_ai.request.model"])
              for p in metric.data.data_points}
    assert points == {"max_num_queued_reqs": (2, "m"), "max_num_queued_tokens": (1, "m")}


def test_an_unknown_reason_is_dropped_and_counted_never_raised():
    tel = Telemetry(TelemetryConfig(model_name="m", log_stats=False))
    for reason in ("queue_full", None, 3, ["max_num_queued_reqs"]):
        tel.reject(reason)
    got = samples(tel.render().decode())
    assert got['otel_llm_telemetry_dropped_total{model_name="m",engine="0"}'] == 4
    assert sum(v for k, v in got.items() if "admission" in k) == 0


def test_telemetry_off_records_nothing():
    tel = Telemetry(TelemetryConfig(model_name="m", enabled=False))
    tel.reject("max_num_queued_reqs")
    assert tel.render() == b""
