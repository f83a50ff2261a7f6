"""`otel-llm serve --slo-config`: the real server judges each finished request against the file's
objectives and serves goodput on /metrics, under the default profile and any other."""

from __future__ import annotations

import httpx
import openai
from api_server_harness import ServerProcess, sample, wait_until
from prometheus_client.parser import text_string_to_metric_families


def test_served_goodput_counts_every_request_by_what_it_missed(tmp_path):
    slo = tmp_path / "slo.yaml"  # no TTFT can meet 0.1 ms; every e2e meets 60 s
    slo.write_text("objectives:\n  - ttft: {threshold: 0.0001, target: 0.99}\n    e2e: {threshold: 60, target: 0.99}\n")
    server = ServerProcess("--slo-config", str(slo)).start()
    try:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
            for stream in (False, True, False):
                r = client.completions.create(model="dummy", prompt="hello", max_tokens=3, stream=stream)
                if stream:
                    list(r)
        assert wait_until(lambda: sample(server.metrics(), "otel_llm_slo_requests_total") == 3)
        m = server.metrics()
        assert sample(m, "otel_llm_slo_requests_total", missed="ttft", model_name="dummy") == 3
        assert sample(m, "vllm:request_success_total") == 3
        otel = [s for fam in text_string_to_metric_families(httpx.get(f"{server.url}/metrics?compat=otel").text)
                if fam.name == "otel_llm_slo_requests" for s in fam.samples if s.name.endswith("_total")]
        assert {(s.labels["otel_llm_slo_missed"], s.labels["otel_llm_stream"], s.value) for s in otel} == {
            ("ttft", "false", 2), ("ttft", "true", 1)}
    finally:
        server.stop()
