"""Real Prometheus 2.42 and promtool against prometheus_client output."""

import threading
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server

from tests.harness import PrometheusError, PrometheusServer, PromtoolError, free_port, promtool_check_metrics

VLLM_STYLE = """\
# HELP vllm:iteration_tokens_total Histogram of the number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 0.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 3.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 3.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 12.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 5.0
"""


def tiny_registry() -> tuple[CollectorRegistry, Counter, Histogram]:
    registry = CollectorRegistry()
    counter = Counter("requests", "Requests served.", ["model_name"], registry=registry)
    histogram = Histogram(
        "request_latency_seconds",
        "Request latency.",
        ["model_name"],
        buckets=(0.1, 0.5, 1.0),
        registry=registry,
    )
    return registry, counter, histogram


def test_promtool_accepts_prometheus_client_output() -> None:
    registry, counter, histogram = tiny_registry()
    counter.labels("m").inc()
    histogram.labels("m").observe(0.3)
    assert promtool_check_metrics(generate_latest(registry).decode()) == []


def test_promtool_findings_on_vllm_style_names() -> None:
    # promtool 2.42 lints these vLLM names (Prometheus itself ingests them fine).
    assert promtool_check_metrics(VLLM_STYLE) == [
        "vllm:iteration_tokens_total metric names should not contain ':'",
        'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix',
        "vllm:prompt_tokens_total metric names should not contain ':'",
    ]


def test_promtool_flags_counter_without_total_and_unparseable_text() -> None:
    text = "# HELP foo Foo.\n# TYPE foo counter\nfoo 1\n"
    assert promtool_check_metrics(text) == ['foo counter metrics should have "_total" suffix']
    with pytest.raises(PromtoolError, match="parsing error"):
        promtool_check_metrics("garbage{{{ 1\n")


@pytest.fixture
def busy_exporter() -> Iterator[str]:
    """prometheus_client /metrics on a free port, fed by a thread until teardown."""
    registry, counter, histogram = tiny_registry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.02):
            counter.labels("m").inc()
            histogram.labels("m").observe(0.3)  # always in bucket (0.1, 0.5]

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    yield f"127.0.0.1:{server.server_port}"
    stop.set()
    feeder.join()
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.slow
def test_real_prometheus_scrapes_rate_and_quantile(
    prometheus_server: Callable[..., PrometheusServer], busy_exporter: str
) -> None:
    prometheus = prometheus_server(busy_exporter)
    prometheus.wait_for_scrapes(3, timeout_s=30)

    assert prometheus.value('up{job="target"}') == 1.0
    assert prometheus.value('rate(requests_total{model_name="m"}[10s])') > 0
    # All observations sit in (0.1, 0.5]; linear interpolation puts the median mid-bucket.
    median = prometheus.value(
        "histogram_quantile(0.5, sum by (le) (rate(request_latency_seconds_bucket[10s])))"
    )
    assert median == pytest.approx(0.3)
    assert prometheus.query("absent(nonexistent_metric)")[0]["value"][1] == "1"


@pytest.mark.slow
def test_wait_for_scrapes_times_out_with_target_state(
    prometheus_server: Callable[..., PrometheusServer],
) -> None:
    prometheus = prometheus_server(f"127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(PrometheusError, match="0/1 successful scrapes.*lastError.*log tail"):
        prometheus.wait_for_scrapes(1, timeout_s=8)
