"""--show-hidden-metrics-for-version and --custom-histogram-buckets: through a hand-driven Telemetry,
on /metrics and in the OTLP export alike, and through the real server's flags."""

import httpx
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families as parse_text

from otel_llm import FinishReason, RequestInfo
from otel_llm.canonical import instruments as I
from otel_llm.engine.step import SchedulerSnapshot
from otel_llm.shim.custom_buckets import parse_specs
from tests.otel_llm.conftest import Harness
from tests.server.api.api_server_harness import ServerProcess

S, MS = 1_000_000_000, 1_000_000
HIDDEN = {"0.8": {"vllm:time_in_queue_requests"},
          "0.10": {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits"},
          "0.11": {"vllm:time_per_output_token_seconds"}}
ALL_HIDDEN = set().union(*HIDDEN.values())


def run(h: Harness, e2e_ms=(200, 700, 3000)) -> None:
    """One request per e2e latency (ms), 3 tokens each; prefix cache 40 queried / 16 hit; KV 25%."""
    for i, ms in enumerate(e2e_ms):
        h.fclock.t = S
        rid = h.tel.arrival(RequestInfo(f"r{i}", 10, "chat", max_tokens=8))
        h.at(S).queued(rid)
        h.at(S + MS).scheduled(rid, 10)
        for k in range(3):
            h.at(S + (10 + k) * MS).outputs([rid], 1)
            if k == 2:
                h.rec.finished(rid, FinishReason.STOP)
            first = (i, k) == (0, 0)
            h.rec.snapshot(SchedulerSnapshot(1, 0, 0.25, prefix_queries=40 if first else 0,
                                             prefix_hits=16 if first else 0))
            h.step(S + (10 + k) * MS, S + (ms if k == 2 else 10 + k) * MS, prompt_tokens=10 if k == 0 else 0)


def families(text: str) -> dict:
    return {f.name: f for f in parse_text(text)}


def samples(fam, suffix: str = "") -> dict:
    return {s.labels.get("le"): s.value for s in fam.samples if s.name == fam.name + suffix}


@pytest.mark.parametrize("version", [None, "0.8", "0.10", "0.10.2", "0.11", "0.32"])
def test_hidden_families_appear_only_with_their_version(version):
    h = Harness(show_hidden_metrics_for_version=version)
    run(h)
    fams = families(h.tel.render().decode())
    key = None if version is None else ".".join(version.split(".")[:2])
    assert ALL_HIDDEN & set(fams) == HIDDEN.get(key, set())


def test_hidden_families_carry_the_new_families_values():
    h = Harness(show_hidden_metrics_for_version="0.10")
    run(h)
    fams = families(h.tel.render().decode())
    assert fams["vllm:gpu_cache_usage_perc"].samples[0].value == 0.25
    assert fams["vllm:gpu_prefix_cache_queries"].samples[0].value == 40
    assert fams["vllm:gpu_prefix_cache_hits"].samples[0].value == 16
    assert fams["vllm:gpu_prefix_cache_hits"].type == "counter"
    assert fams["vllm:gpu_cache_usage_perc"].documentation.endswith("DEPRECATED: Use vllm:kv_cache_usage_perc instead.")
    h = Harness(show_hidden_metrics_for_version="0.11")
    run(h)
    fams = families(h.tel.render().decode())
    old, new = fams["vllm:time_per_output_token_seconds"], fams["vllm:inter_token_latency_seconds"]
    assert [(s.labels, s.value) for s in old.samples] == [(s.labels, s.value) for s in new.samples]
    assert samples(old, "_count")[None] == 6  # two ITL samples per request


def test_bad_hidden_version_is_refused():
    with pytest.raises(ValueError, match="show-hidden-metrics-for-version 'latest'"):
        Harness(show_hidden_metrics_for_version="latest")


def test_custom_buckets_change_exposition_and_otlp_alike():
    h = Harness(custom_histogram_buckets={"request_latency": (0.5, 1, 2.5)})
    reader = InMemoryMetricReader()
    h.tel.attach_reader(reader)
    run(h)  # e2e 0.2, 0.7, 3.0 s
    e2e = families(h.tel.render().decode())["vllm:e2e_request_latency_seconds"]
    assert samples(e2e, "_bucket") == {"0.5": 1, "1.0": 2, "2.5": 2, "+Inf": 3}
    queue = families(h.tel.render().decode())["vllm:request_queue_time_seconds"]  # the same bucket family
    assert list(samples(queue, "_bucket")) == ["0.5", "1.0", "2.5", "+Inf"]
    otel = families(h.tel.render(profile="otel").decode())["gen_ai_server_request_duration_seconds"]
    assert list(samples(otel, "_bucket")) == ["0.5", "1.0", "2.5", "+Inf"]
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    point = metrics["gen_ai.server.request.duration"].data.data_points[0]
    assert list(point.explicit_bounds) == [0.5, 1.0, 2.5]
    assert list(point.bucket_counts) == [1, 1, 0, 1]
    # untouched families keep vLLM's buckets; SGLang's profile keeps SGLang's
    ttft = families(h.tel.render().decode())["vllm:time_to_first_token_seconds"]
    assert [float(b) for b in samples(ttft, "_bucket") if b != "+Inf"] == list(I.VLLM_TTFT)


def test_a_named_histogram_overrides_its_bucket_family():
    h = Harness(custom_histogram_buckets={"request_latency": (0.5, 1), "vllm:e2e_request_latency_seconds": (2.0,)})
    run(h)
    fams = families(h.tel.render().decode())
    assert samples(fams["vllm:e2e_request_latency_seconds"], "_bucket") == {"2.0": 2, "+Inf": 3}
    assert list(samples(fams["vllm:request_queue_time_seconds"], "_bucket")) == ["0.5", "1.0", "+Inf"]


@pytest.mark.parametrize("spec, message", [
    ("request_latency=", "bound '' is not a number"),
    ("request_latency=1,1", "strictly increasing"),
    ("request_latency=-1,2", "finite and positive"),
    ("request_latency=1,inf", "finite and positive"),
    ("nope=1,2", "nope: not a histogram family"),
    ('{"request_latency": [true]}', "not a boolean"),
    ("request_latency", "expected NAME=b1,b2"),
])
def test_bad_bucket_specs_name_the_value(spec, message):
    with pytest.raises(ValueError, match=message):
        Harness(custom_histogram_buckets=parse_specs([spec]))


def test_vllm_json_form_is_accepted():
    assert parse_specs(['{"request_latency": [0.01, 0.05]}', "time_to_first_token=0.1,1"]) == {
        "request_latency": (0.01, 0.05), "time_to_first_token": (0.1, 1.0)}


@pytest.mark.slow
def test_server_flags():
    server = ServerProcess("--custom-histogram-buckets", "time_to_first_token=0.25,30",
                           "--show-hidden-metrics-for-version", "0.10").start()
    try:
        httpx.post(f"{server.url}/v1/completions", json={"model": "dummy", "prompt": "hi", "max_tokens": 4},
                   timeout=30).raise_for_status()
        fams = families(httpx.get(f"{server.url}/metrics").text)
        ttft = fams["vllm:time_to_first_token_seconds"]
        assert list(samples(ttft, "_bucket")) == ["0.25", "30.0", "+Inf"]
        assert samples(ttft, "_count")[None] == 1
        assert "vllm:gpu_cache_usage_perc" in fams and "vllm:time_per_output_token_seconds" not in fams
    finally:
        server.stop()
    bad = ServerProcess("--custom-histogram-buckets", "time_to_first_token=2,1")
    try:
        with pytest.raises(RuntimeError, match="exited with 2"):
            bad.start(timeout_s=30)
        assert "--custom-histogram-buckets time_to_first_token: bounds must be strictly increasing" in bad.output()
    finally:
        bad.stop()
