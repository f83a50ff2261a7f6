"""A real Prometheus scrapes the server's `/metrics?compat=sglang` under load; PromQL copied
verbatim from SGLang's own Grafana dashboard returns data with sane values."""

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from openai import OpenAI

from tests.harness.prometheus import PrometheusServer
from tests.server.api.api_server_harness import ServerProcess

# sgl-project/sglang examples/monitoring/grafana/dashboards/json/sglang-dashboard.json (commit bac2cc67),
# `expr` verbatim (trailing "\r\n" dropped); the Grafana variables are replaced in `promql()`.
DASHBOARD = {
    # panel 14 "End-to-End Request Latency", refId A (P99) and D (Avg)
    "e2e_p99": "histogram_quantile(0.99, sum by (le) (rate(sglang:e2e_request_latency_seconds_bucket"
               "[$__rate_interval])))",
    "e2e_avg": "avg(rate(sglang:e2e_request_latency_seconds_sum[$__rate_interval]) /  "
               "rate(sglang:e2e_request_latency_seconds_count[$__rate_interval]))",
    # panel 17 "End-to-End Request Latency(s) Heatmap"
    "e2e_heatmap": 'sum(increase(sglang:e2e_request_latency_seconds_bucket{model_name=~"$model_name"}'
                   "[$__rate_interval])) by (le)",
    # panel 20 "Time-To-First-Token Latency", refId C (P50) and D (Avg)
    "ttft_p50": "histogram_quantile(0.5, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket"
                "[$__rate_interval])))",
    "ttft_avg": "avg(rate(sglang:time_to_first_token_seconds_sum[$__rate_interval]) /  "
                "rate(sglang:time_to_first_token_seconds_count[$__rate_interval]))",
    # panel 19 "Time-To-First-Token Seconds Heatmap"
    "ttft_heatmap": 'sum by(le) (increase(sglang:time_to_first_token_seconds_bucket{model_name=~"$model_name"}'
                    "[$__rate_interval]))",
    # panel 7 "Num Running Requests", panel 8 "Number Queued Requests"
    "running": "sglang:num_running_reqs",
    "queued": "sglang:num_queue_reqs",
}
MODEL = "dummy"
CONCURRENCY = 8
PREFIX = "You are a careful assistant; answer in one short sentence. " * 4  # shared: prefix-cache hits


def promql(key: str) -> str:
    """The dashboard's expression with Grafana's variables as a test run fixes them (the run is
    shorter than a minute, so a 1m window holds all of it)."""
    return DASHBOARD[key].replace("$__rate_interval", "1m").replace("$model_name", MODEL)


class Load:
    """Closed-loop load on CONCURRENCY threads, streamed and non-streamed requests alternating."""

    def __init__(self, url: str):
        self.client = OpenAI(base_url=f"{url}/v1", api_key="x")
        self.stop = threading.Event()
        self.done = self.streamed = 0
        self._lock = threading.Lock()

    def request(self, i: int) -> None:
        args = {"model": MODEL, "prompt": f"{PREFIX}question {i}", "max_tokens": 16, "temperature": 0}
        if i % 2:
            assert list(self.client.completions.create(**args, stream=True))
        else:
            assert self.client.completions.create(**args).choices
        with self._lock:
            self.done += 1
            self.streamed += i % 2

    def worker(self, w: int) -> None:
        i = w
        while not self.stop.is_set():
            self.request(i)
            i += CONCURRENCY


@pytest.mark.slow
def test_sglang_dashboard_promql_returns_data():
    server = ServerProcess().start()
    try:
        with PrometheusServer(f"127.0.0.1:{server.port}", params={"compat": "sglang"}) as prom:
            load = Load(server.url)
            load.request(0)
            load.request(1)  # both is_streaming series exist before the load: rate() sees it all
            prom.wait_for_scrapes(2, timeout_s=30)
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                workers = [pool.submit(load.worker, w) for w in range(CONCURRENCY)]
                prom.wait_for_scrapes(5, timeout_s=30)
                for key in ("running", "queued"):  # scraped during the load
                    (series,) = prom.query(promql(key))
                    assert series["metric"]["model_name"] == MODEL and series["metric"]["engine_type"] == "unified"
                    assert 0 <= float(series["value"][1]) <= CONCURRENCY, key
                assert prom.value("max_over_time(sglang:num_running_reqs[1m])") >= 1
                load.stop.set()
                for w in workers:
                    w.result()
            prom.wait_for_scrapes(7, timeout_s=30)  # the last requests' counts are in

            for key in ("e2e_p99", "e2e_avg", "ttft_p50", "ttft_avg"):
                v = prom.value(promql(key))
                assert not math.isnan(v) and 0 < v < 60, (key, v)
            for key, buckets in (("e2e_heatmap", 22), ("ttft_heatmap", 18)):
                result = prom.query(promql(key))
                by_le = {s["metric"]["le"]: float(s["value"][1]) for s in result}
                assert len(by_le) == buckets + 1, key  # SGLang's bounds and +Inf
                assert by_le["+Inf"] > 0 and all(v <= by_le["+Inf"] for v in by_le.values()), key

            assert prom.value("sum(sglang:num_requests_total)") == load.done
            assert prom.value('sglang:num_requests_total{is_streaming="true"}') == load.streamed
            assert prom.value('sglang:cached_tokens_total{cache_source="device"}') > 0
            assert 0 <= prom.value("sglang:token_usage") <= 1
            assert prom.value("sglang:page_size") == 16
    finally:
        server.stop()
