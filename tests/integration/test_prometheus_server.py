"""A real Prometheus scrapes the real server's /metrics; PromQL over the vLLM names returns values."""

import httpx
import pytest
from openai import OpenAI

from tests.harness.prometheus import PrometheusServer, promtool_check_metrics
from tests.server.api.api_server_harness import ServerProcess


@pytest.mark.slow
def test_prometheus_scrapes_vllm_names_and_promql_works():
    server = ServerProcess().start()
    try:
        with PrometheusServer(f"127.0.0.1:{server.port}") as prom:
            client = OpenAI(base_url=f"{server.url}/v1", api_key="x")
            prom.wait_for_scrapes(1, timeout_s=30)
            for i in range(12):
                client.completions.create(model="dummy", prompt=f"hello {i}", max_tokens=8, temperature=0)
            prom.wait_for_scrapes(3, timeout_s=30)
            window = "[1m]"
            assert prom.value(f"sum(rate(vllm:generation_tokens_total{window}))") > 0
            assert prom.value(f"sum(rate(vllm:request_success_total{window}))") > 0
            p50 = prom.value(f"histogram_quantile(0.5, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{window})))")
            assert 0 < p50 < 60
            ttft = prom.value(f"histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{window})))")
            assert 0 < ttft < 60
            assert prom.value('sum(vllm:request_success_total{finished_reason="length"})') == 12
        text = httpx.get(f"{server.url}/metrics").text
        findings = promtool_check_metrics(text)
        unexplained = [f for f in findings if "should not contain ':'" not in f
                       and f != 'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix']
        assert unexplained == [], unexplained
    finally:
        server.stop()
