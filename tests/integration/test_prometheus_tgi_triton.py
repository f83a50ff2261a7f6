"""A real Prometheus scrapes the real server as TGI and as Triton; the servers' dashboards return data.

One server, one Prometheus with two scrape jobs (`/metrics?compat=tgi`, `/metrics?compat=triton`),
each with the target label its dashboard selects on (TGI's `container`, Triton's `pod`). The
PromQL is copied verbatim from:
- huggingface/text-generation-inference `db931fcf` `assets/tgi_grafana.json` (variable `$service`
  = `label_values(tgi_request_count, container)`, here "tgi-router");
- triton-inference-server/server `e1db8a60` `deploy/k8s-onprem/dashboard.json` (no variables).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from openai import OpenAI

from tests.harness.prometheus import PrometheusError, PrometheusServer
from tests.server.api.api_server_harness import ServerProcess, wait_until

SERVICE = "tgi-router"
# (panel title, expr) from assets/tgi_grafana.json
TGI_PANELS = [
    ("Latency quantiles",
     'histogram_quantile(0.5, sum by (le) (rate(tgi_request_duration_bucket{container="$service"}[10m])))'),
    ("Requests", 'sum(increase(tgi_request_success{container="$service"}[1m]))'),
    ("Number of tokens per prompt",
     'histogram_quantile(0.9, sum by (le) (rate(tgi_request_input_length_bucket{container="$service"}[10m])))'),
    ("Throughput (generated tok/s)", 'sum((rate(tgi_request_generated_tokens_sum{container="$service"}[10m]) / '
                                     'rate(tgi_request_generated_tokens_count{container="$service"}[10m]))>0)'),
    ("Queue Size", 'sum(tgi_queue_size{container="$service"})'),
    ("Number of replicas", 'count(tgi_request_count{container="$service"})'),
]
# (panel title, expr) from deploy/k8s-onprem/dashboard.json
TRITON_PANELS = [
    ("Active Triton Instances", "count(count(nv_inference_count) by (instance))"),
    ("Cumulative Inference Requests by Pod", "sum(nv_inference_request_success) by (pod)"),
    ("Cumulative Inference Requests by Pod", "sum(nv_inference_request_failure) by (pod)"),
    ("Proportion of Requests by Pod",
     "sum by (pod) (rate(nv_inference_count[1m])) / ignoring(pod) group_left sum (rate(nv_inference_count[1m]))"),
    ("Compute Time by Model (milliseconds)",
     "sum(rate(nv_inference_compute_infer_duration_us[30s])) by (model) / 1000"),
    ("Average Queue Time by Pod (microseconds)",
     "avg(rate(nv_inference_queue_duration_us[30s])/(1+rate(nv_inference_request_success[30s]))) by (pod)"),
]
N_REQUESTS, MAX_TOKENS = 24, 12


class TwoProfilePrometheus(PrometheusServer):
    """Job `tgi` scrapes `?compat=tgi` with container="tgi-router", job `triton` `?compat=triton` with
    pod="triton-0": the target labels the dashboards select on."""

    def _config(self) -> dict:
        config = super()._config()
        tgi = config["scrape_configs"][0]
        tgi["static_configs"][0]["labels"] = {"container": SERVICE}
        triton = {**tgi, "job_name": "triton", "params": {"compat": ["triton"]},
                  "static_configs": [{"targets": [self.target], "labels": {"pod": "triton-0"}}]}
        config["scrape_configs"].append(triton)
        return config


def _scrapes(prom: PrometheusServer, job: str) -> float:
    result = prom.query(f'sum_over_time(up{{job="{job}"}}[1h])')
    return float(result[0]["value"][1]) if result else 0.0


def _wait_scrapes(prom: PrometheusServer, n: int) -> None:
    for job in ("tgi", "triton"):
        if not wait_until(lambda: _scrapes(prom, job) >= n, timeout_s=30, interval_s=0.2):
            raise PrometheusError(f"job {job}: {_scrapes(prom, job):.0f}/{n} scrapes; log:\n{prom.log_tail()}")


def _wait_for(prom: PrometheusServer, promql: str, value: float) -> None:
    """Until Prometheus has scraped `promql` == `value`."""
    def seen() -> bool:
        result = prom.query(promql)
        return bool(result) and float(result[0]["value"][1]) == value
    if not wait_until(seen, timeout_s=30, interval_s=0.2):
        raise PrometheusError(f"{promql} = {prom.query(promql)}, not {value}; log:\n{prom.log_tail()}")


def _load(url: str, n: int) -> None:
    """Concurrent completions and chats, half streamed, more at once than --max-num-seqs."""
    client = OpenAI(base_url=f"{url}/v1", api_key="x")

    def one(i: int) -> None:
        if i % 2:
            client.completions.create(model="dummy", prompt=f"hello {i} " * (i + 1), max_tokens=MAX_TOKENS,
                                      stream=i % 4 == 1, temperature=0)
        else:
            stream = client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": f"hi {i}"}],
                                                    max_tokens=MAX_TOKENS, stream=True, temperature=0)
            for _ in stream:
                pass

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(n)))


@pytest.mark.slow
def test_tgi_and_triton_dashboards_show_the_server_under_load():
    server = ServerProcess("--num-kv-blocks", "256", "--max-num-seqs", "4").start()
    try:
        with TwoProfilePrometheus(f"127.0.0.1:{server.port}", job="tgi", params={"compat": "tgi"}) as prom:
            _wait_scrapes(prom, 1)
            # TGI's exporter (and the profile) writes a series once touched: Prometheus must have it
            # before the load, or rate() over it is 0 (a series' first sample is no increase).
            _load(server.url, 2)
            _wait_for(prom, "sum(tgi_request_success)", 2)
            _load(server.url, N_REQUESTS - 2)
            _wait_for(prom, "sum(tgi_request_success)", N_REQUESTS)
            _wait_for(prom, "sum(nv_inference_request_success)", N_REQUESTS)

            tgi = [prom.query(expr.replace("$service", SERVICE)) for _, expr in TGI_PANELS]
            assert all(tgi), [t for (t, _), r in zip(TGI_PANELS, tgi) if not r]
            latency, requests, prompt_p90, tokens, queue, replicas = (float(r[0]["value"][1]) for r in tgi)
            assert 0 < latency < 60
            assert requests > 0
            assert 1 <= prompt_p90 <= 2048  # the dummy model's max_model_len
            assert tokens == pytest.approx(MAX_TOKENS)  # the mean generated tokens per request, despite its title
            assert queue >= 0 and replicas == 1

            triton = [prom.query(expr) for _, expr in TRITON_PANELS]
            assert all(triton), [t for (t, _), r in zip(TRITON_PANELS, triton) if not r]
            instances, success, failure, proportion, compute, queue_us = triton
            assert float(instances[0]["value"][1]) == 1
            assert success[0]["metric"] == {"pod": "triton-0"} and float(success[0]["value"][1]) == N_REQUESTS
            assert float(failure[0]["value"][1]) == 0
            assert float(proportion[0]["value"][1]) == pytest.approx(1.0)
            assert compute[0]["metric"] == {"model": "dummy"} and float(compute[0]["value"][1]) > 0
            assert float(queue_us[0]["value"][1]) >= 0
    finally:
        server.stop()
