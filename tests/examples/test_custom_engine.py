"""examples/custom_engine.py as a user runs it: its printed counts, and its OTLP push of metrics into
`otel-llm collector` and of spans into an OTLP receiver."""

import subprocess
import sys
from pathlib import Path

from otel_llm.collector.receiver.otlp_http import OtlpReceiver
from otel_llm.collector.service import Collector, CollectorConfig
from tests.collector.otlp_builders import samples
from tests.harness.memory_sink import MemorySink

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_engine.py"


def run_example(*argv: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, str(EXAMPLE), *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return samples(done.stdout)


def total(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k.startswith(name + "{"))


def test_is_well_under_100_lines():
    assert len(EXAMPLE.read_text().splitlines()) < 100


def test_prints_what_it_served():
    values = run_example("--requests", "12")
    assert total(values, "vllm:request_success_total") == 12
    assert total(values, "vllm:time_to_first_token_seconds_count") == 12
    assert total(values, "vllm:generation_tokens_total") >= 12
    assert total(values, "vllm:request_queue_time_seconds_sum") > 0  # batches of 4: later requests waited


def test_pushes_metrics_to_the_collector_and_spans_over_otlp():
    sink = MemorySink()
    with Collector(CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0)) as collector, \
            OtlpReceiver(sink) as traces:
        printed = run_example("--requests", "6", "--otlp-metrics-endpoint", collector.http.endpoint,
                              "--otlp-traces-endpoint", traces.endpoint)
        text = collector.render().decode()
    pushed = samples(text)
    assert total(pushed, "vllm:request_success_total") == 6
    assert total(pushed, "vllm:generation_tokens_total") == total(printed, "vllm:generation_tokens_total")
    assert 'job="toy-engine"' in text
    names = [s.name for s in sink.received_spans()]
    assert names.count("text_completion toy-bigram") == 6 and names.count("decode") == 6
