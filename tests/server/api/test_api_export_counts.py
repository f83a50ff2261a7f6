"""Lost telemetry is counted: the real server's OTLP exporters report on `/metrics` and in
`/health` every span and metric point they sent, failed to send, or dropped on a full queue,
against a dead backend and against a live one (the collector's OTLP receiver)."""

from __future__ import annotations

import socket
from collections import Counter

import openai
import pytest
from api_server_harness import ServerProcess, sample, wait_until

from otel_llm.collector.receiver.otlp_http import OtlpReceiver
from tests.harness.memory_sink import MemorySink

pytestmark = pytest.mark.slow

SPANS_PER_REQUEST = 5  # HTTP SERVER span, gen_ai span, and its queue/prefill/decode children (checked below)
FIELDS = ("sent", "send_failed", "enqueue_failed")


def _requests(server: ServerProcess, n: int) -> None:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
        for i in range(n):
            c.completions.create(model="dummy", prompt=f"prompt {i}", max_tokens=3, extra_body={"ignore_eos": True})


def _counts(metrics: dict, records: str) -> dict[str, float]:
    """One exporter's numbers on `/metrics`, keyed like `/health`'s."""
    out = {f: sample(metrics, f"otel_llm_exporter_{f}_{records}_total") for f in FIELDS}
    if records == "spans":
        out |= {f: sample(metrics, f"otel_llm_exporter_{f}", data_type="traces")
                for f in ("queue_size", "queue_capacity")}
    return out


@pytest.mark.parametrize("backend", ["closed", "hung"])
def test_dead_backend_every_span_counted(backend):
    """Backend down, a 20-span queue: every span ended is sent-failed, dropped or still queued.
    A closed port fails each export at once; a hung backend (it never answers) holds each
    for the 0.5 s export timeout, so the queue fills and spans are dropped."""
    n = 30
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        if backend == "hung":
            dead.listen()  # connections are made, never answered
        url = f"http://127.0.0.1:{dead.getsockname()[1]}"
        server = ServerProcess("--otlp-traces-endpoint", url, "--otlp-metrics-endpoint", url, "--no-engine-lane", env={
            "OTEL_BSP_MAX_QUEUE_SIZE": "20", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10", "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5", "OTEL_METRIC_EXPORT_INTERVAL": "200"}).start()
        try:
            _requests(server, n)
            spans = wait_until(lambda: (c := _counts(server.metrics(), "spans"))["queue_size"] == 0 and
                               sum(c[f] for f in FIELDS) == n * SPANS_PER_REQUEST and c, timeout_s=30)
            assert spans, _counts(server.metrics(), "spans")
            assert spans["sent"] == 0 and spans["send_failed"] > 0 and spans["queue_capacity"] == 20
            if backend == "hung":
                assert spans["enqueue_failed"] > 0
            health = server.health().json()["exporters"]
            assert health["traces"] == spans  # nothing moves any more: /health shows the same numbers
            points = wait_until(lambda: (c := _counts(server.metrics(), "metric_points"))["send_failed"] > 0 and c)
            assert points and points["sent"] == 0 and points["enqueue_failed"] == 0
            assert health["metrics"]["sent"] == 0 and health["metrics"]["send_failed"] <= points["send_failed"]
            assert health["metrics"]["queue_capacity"] == 0  # a periodic reader has no queue: no queue series
            assert all(("data_type", "metrics") not in k for k in server.metrics()["otel_llm_exporter_queue_capacity"])
        finally:
            server.stop()


def test_live_backend_sent_is_what_it_received():
    n = 8
    sink = MemorySink()
    with OtlpReceiver(sink) as receiver:
        server = ServerProcess("--otlp-traces-endpoint", receiver.endpoint, "--otlp-metrics-endpoint",
                               receiver.endpoint, env={"OTEL_BSP_SCHEDULE_DELAY": "100",
                                                       "OTEL_METRIC_EXPORT_INTERVAL": "300"}).start()
        try:
            _requests(server, n)

            def spans():  # the receiver has a batch a moment before its send returns and is counted
                c = _counts(server.metrics(), "spans")
                requests = [s for s in sink.received_spans() if s.name != "engine steps"]
                return c["sent"] == len(sink.received_spans()) and len(requests) == n * SPANS_PER_REQUEST and c

            c = wait_until(spans, timeout_s=30)
            windows = [s for s in sink.received_spans() if s.name == "engine steps"]  # the engine lane's, one trace each
            assert windows and c == {"sent": n * SPANS_PER_REQUEST + len(windows), "send_failed": 0,
                                     "enqueue_failed": 0, "queue_size": 0, "queue_capacity": 8192}, c
            per_trace = Counter(s.trace_id for s in sink.received_spans())
            assert {per_trace[s.trace_id] for s in windows} == {1}
            assert set(per_trace.values()) == {SPANS_PER_REQUEST, 1} and len(per_trace) == n + len(windows)
            assert server.health().json()["exporters"]["traces"] == c

            def points():  # between two periodic exports
                c = _counts(server.metrics(), "metric_points")
                return c["sent"] == sum(len(m.points) for m in sink.received_metrics()) > 0 and c

            c = wait_until(points, timeout_s=30)
            assert c and c["send_failed"] == c["enqueue_failed"] == 0
            health = server.health().json()["exporters"]["metrics"]
            assert health["sent"] >= c["sent"] and health["send_failed"] == 0
        finally:
            server.stop()
