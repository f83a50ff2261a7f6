"""Remote-write 1.0: the wire encoding, the queue + retry helper, and delivery to a real Prometheus."""

from __future__ import annotations

import base64
import json
import logging
import math
import struct
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import cramjam
import pytest

from otel_llm.collector.exporter.queue import ExporterQueue, PermanentError, QueueConfig, RetryableError, RetryConfig
from otel_llm.collector.exporter.remote_write.exporter import RemoteWriteConfig, RemoteWriteExporter
from otel_llm.collector.exporter.remote_write.proto import (
    STALE_NAN, Exemplar, Label, MetricMetadata, PrwExemplar, PrwSeries, Sample, WriteRequest, decode_write_request,
    encode_write_request,
)
from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.export.redaction import redact_url
from tests.harness import free_port
from tests.harness.scripted_http import ScriptedReceiver

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"
FAST_RETRY = RetryConfig(initial_interval_s=0.01, max_interval_s=0.05, max_elapsed_time_s=2.0)


def series(name: str, value: float, ts_ms: int = 1_700_000_000_000, exemplar=None, **labels: str) -> PrwSeries:
    return PrwSeries(tuple(sorted({"__name__": name, **labels}.items())), value, ts_ms, exemplar)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.005)


# ---------------------------------------------------------------- wire format


def test_field_numbers_are_prompb_v2_42() -> None:
    assert Label(name="a", value="b").SerializeToString() == b"\x0a\x01a\x12\x01b"
    assert Sample(value=1.0, timestamp=2).SerializeToString() == b"\x09" + struct.pack("<d", 1.0) + b"\x10\x02"
    exemplar = Exemplar(labels=[Label(name="a", value="b")], value=1.0, timestamp=2).SerializeToString()
    assert exemplar == b"\x0a\x06\x0a\x01a\x12\x01b" + b"\x11" + struct.pack("<d", 1.0) + b"\x18\x02"
    metadata = MetricMetadata(type=MetricMetadata.COUNTER, metric_family_name="f", help="h", unit="u")
    assert metadata.SerializeToString() == b"\x08\x01\x12\x01f\x22\x01h\x2a\x01u"
    request = WriteRequest(metadata=[MetricMetadata(type=MetricMetadata.GAUGE)])
    request.timeseries.add(labels=[Label(name="a", value="b")], samples=[Sample(value=1.0)],
                           exemplars=[Exemplar(value=1.0)])
    wire = request.SerializeToString()
    assert wire[0] == 0x0A and wire.endswith(b"\x1a\x02\x08\x02")  # timeseries = 1, metadata = 3
    ts = request.timeseries[0].SerializeToString()
    assert [ts[0], ts[8], ts[19]] == [0x0A, 0x12, 0x1A]  # labels = 1, samples = 2, exemplars = 3
    assert WriteRequest.DESCRIPTOR.full_name == "prometheus.WriteRequest"


def test_round_trip_labels_samples_exemplars() -> None:
    ex = PrwExemplar((("span_id", SPAN_ID), ("trace_id", TRACE_ID)), 0.42, 1_700_000_000_123)
    batch = [
        series("vllm:request_success_total", 7.0, engine="0", finished_reason="stop", model_name="m"),
        series("vllm:e2e_request_latency_seconds_bucket", 3.0, 1_700_000_000_500, ex, le="0.5", model_name="m"),
        series("gone", STALE_NAN, 1_700_000_001_000),
    ]
    request = decode_write_request(encode_write_request(batch))
    assert len(request.timeseries) == 3
    for ts, s in zip(request.timeseries, batch):
        assert tuple((label.name, label.value) for label in ts.labels) == s.labels  # order kept as given
        assert len(ts.samples) == 1 and ts.samples[0].timestamp == s.timestamp_ms
    assert request.timeseries[0].samples[0].value == 7.0
    assert [len(ts.exemplars) for ts in request.timeseries] == [0, 1, 0]
    exemplar = request.timeseries[1].exemplars[0]
    assert {lb.name: lb.value for lb in exemplar.labels} == {"span_id": SPAN_ID, "trace_id": TRACE_ID}
    assert (exemplar.value, exemplar.timestamp) == (0.42, 1_700_000_000_123)
    stale = request.timeseries[2].samples[0].value
    assert struct.pack("<d", stale) == struct.pack("<Q", 0x7FF0000000000002)


def test_stale_nan_bits() -> None:
    assert math.isnan(STALE_NAN)
    assert struct.unpack("<Q", struct.pack("<d", STALE_NAN))[0] == 0x7FF0000000000002


def test_body_is_snappy_block_format() -> None:
    body = encode_write_request([series("x", 1.0, job="j")] * 50)
    assert isinstance(body, bytes)
    raw = bytes(cramjam.snappy.decompress_raw(body))
    assert WriteRequest.FromString(raw).timeseries[49].labels[0].value == "x"
    assert not body.startswith(b"\xff\x06\x00\x00sNaPpY")  # the framed format's stream identifier
    assert len(body) < len(raw)


def test_empty_request() -> None:
    assert len(decode_write_request(encode_write_request([])).timeseries) == 0


# ---------------------------------------------------------------- a scripted receiver


@pytest.fixture
def receiver_factory() -> Iterator[Callable[..., ScriptedReceiver]]:
    made: list[ScriptedReceiver] = []

    def make(script=None) -> ScriptedReceiver:
        made.append(ScriptedReceiver(script))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def exporter_factory() -> Iterator[Callable[..., RemoteWriteExporter]]:
    made: list[RemoteWriteExporter] = []

    def make(url: str, **kwargs: Any) -> RemoteWriteExporter:
        kwargs.setdefault("retry", FAST_RETRY)
        exporter = RemoteWriteExporter(RemoteWriteConfig(url, **kwargs))
        exporter.start()
        made.append(exporter)
        return exporter

    yield make
    for e in made:
        e.stop(1.0)


# ---------------------------------------------------------------- exporter over HTTP


def test_headers_body_and_keep_alive(receiver_factory, exporter_factory) -> None:
    rx = receiver_factory()
    exporter = exporter_factory(rx.url, headers=(("X-Scope-OrgID", "tenant-1"),), name="prometheusremotewrite/3")
    for i in range(3):
        exporter.export([series("x", float(i), job="j")])
        wait_for(lambda: exporter.stats().sent == i + 1)
    assert exporter.name == "prometheusremotewrite/3"
    headers = rx.received[0].headers
    assert headers["Content-Encoding"] == "snappy"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["User-Agent"].startswith("otel-llm/")
    assert headers["X-Prometheus-Remote-Write-Version"] == "0.1.0"
    assert headers["X-Scope-OrgID"] == "tenant-1"
    assert [decode_write_request(r.body).timeseries[0].samples[0].value for r in rx.received] == [0.0, 1.0, 2.0]
    assert len({r.client_port for r in rx.received}) == 1  # one persistent connection


def test_split_into_requests_of_max_samples(receiver_factory, exporter_factory) -> None:
    rx = receiver_factory()
    exporter = exporter_factory(rx.url, max_samples_per_send=3)
    exporter.export([series("x", float(i), i=str(i)) for i in range(7)])
    wait_for(lambda: exporter.stats().sent == 7)
    assert [len(decode_write_request(r.body).timeseries) for r in rx.received] == [3, 3, 1]
    assert exporter.stats()[:4] == (7, 0, 0, 0)


def test_503_is_retried_then_delivered_once(receiver_factory, exporter_factory) -> None:
    rx = receiver_factory([(503, {}, b"busy"), (503, {}, b"busy")])
    exporter = exporter_factory(rx.url)
    exporter.export([series("x", 1.0), series("y", 2.0)])
    wait_for(lambda: exporter.stats().sent == 2)
    assert len(rx.received) == 3
    assert len({r.body for r in rx.received}) == 1  # the same request each time
    assert exporter.stats().send_failed == 0


def test_429_waits_for_retry_after(receiver_factory, exporter_factory) -> None:
    rx = receiver_factory([(429, {"Retry-After": "1"}, b"slow down")])
    exporter = exporter_factory(rx.url)
    exporter.export([series("x", 1.0)])
    wait_for(lambda: exporter.stats().sent == 1)
    first, second = rx.received
    assert second.time_s - first.time_s >= 0.95  # not the 10 ms backoff


def test_400_is_permanent_and_its_body_logged(receiver_factory, exporter_factory, caplog) -> None:
    caplog.set_level(logging.WARNING)
    rx = receiver_factory([(400, {}, b"out of order sample")])
    exporter = exporter_factory(rx.url)
    exporter.export([series("x", 1.0), series("y", 1.0), series("z", 1.0)])
    wait_for(lambda: exporter.stats().send_failed == 3)
    time.sleep(0.05)  # a retry would come after 10 ms
    assert len(rx.received) == 1
    assert exporter.stats().sent == 0
    assert "HTTP 400" in caplog.text and "out of order sample" in caplog.text


def test_connection_refused_is_retried_until_max_elapsed(exporter_factory, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm.collector.exporter.queue")
    retry = RetryConfig(initial_interval_s=0.01, max_interval_s=0.02, max_elapsed_time_s=0.2)
    exporter = exporter_factory(f"http://127.0.0.1:{free_port()}/api/v1/write", retry=retry)
    started = time.monotonic()
    exporter.export([series("x", 1.0), series("y", 1.0)])
    wait_for(lambda: exporter.stats().send_failed == 2)
    assert time.monotonic() - started >= 0.15
    assert caplog.text.count("retrying in") >= 3
    assert "no retry left" in caplog.text


def test_full_queue_counts_enqueue_failed_and_stop_is_bounded(receiver_factory) -> None:
    rx = receiver_factory()
    rx.hold.clear()  # the receiver stalls every answer
    config = RemoteWriteConfig(rx.url, max_samples_per_send=2, queue=QueueConfig(queue_size=2), retry=FAST_RETRY)
    exporter = RemoteWriteExporter(config)
    exporter.start()
    exporter.export([series("x", 1.0, i=str(i)) for i in range(2)])
    wait_for(lambda: len(rx.received) == 1)  # in flight, stalled
    exporter.export([series("x", 1.0, i=str(i)) for i in range(9)])  # 5 requests: 2 fit
    assert exporter.stats()[:5] == (0, 0, 5, 2, 2)
    started = time.monotonic()
    exporter.stop(0.3)
    assert time.monotonic() - started < 1.0
    # Queued ones dropped at once; the stalled POST is aborted and counted right after.
    wait_for(lambda: exporter.stats().send_failed == 6, timeout_s=2.0)
    assert exporter.stats()[:5] == (0, 6, 5, 0, 2)
    exporter.export([series("late", 1.0)])
    assert exporter.stats().enqueue_failed == 6


def test_stop_drains_what_is_queued(receiver_factory) -> None:
    rx = receiver_factory([(503, {}, b"")])
    exporter = RemoteWriteExporter(RemoteWriteConfig(rx.url, max_samples_per_send=1, retry=FAST_RETRY))
    exporter.export([series("x", float(i)) for i in range(5)])  # queued before start
    exporter.start()
    exporter.stop(5.0)
    assert exporter.stats()[:4] == (5, 0, 0, 0)


def test_export_never_raises(receiver_factory, exporter_factory) -> None:
    rx = receiver_factory()
    exporter = exporter_factory(rx.url, max_samples_per_send=1)
    bad = PrwSeries((("__name__", 7),), 1.0, 1)  # type: ignore[arg-type]
    exporter.export([bad, series("x", 1.0)])
    exporter.export(None)  # type: ignore[arg-type]
    wait_for(lambda: exporter.stats().sent == 1)
    assert exporter.stats().enqueue_failed == 1


# ---------------------------------------------------------------- the queue itself


def test_queue_offer_never_blocks_and_logs_drops_once(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="otel_llm.collector.exporter.queue")
    release = threading.Event()
    queue: ExporterQueue[int] = ExporterQueue("test/0", lambda item: release.wait(5), QueueConfig(queue_size=3))
    queue.start()
    assert queue.offer(0, 10)
    wait_for(lambda: queue.stats().queue_size == 0)  # taken, in flight
    assert all(queue.offer(i, 10) for i in range(3))
    assert [queue.offer(i, 10) for i in range(100)] == [False] * 100
    assert queue.stats()[:5] == (0, 0, 1000, 3, 3)
    assert len(caplog.records) == 1 and "dropped 10 points" in caplog.records[0].getMessage()
    release.set()
    assert queue.stop(2.0)
    assert queue.stats()[:5] == (40, 0, 1000, 0, 3)
    assert "dropped 990 points in 99 requests" in caplog.records[-1].getMessage()  # flushed at stop


def test_queue_stop_with_failing_backend_is_bounded() -> None:
    def send(item: int) -> None:
        raise RetryableError("down")

    queue: ExporterQueue[int] = ExporterQueue("test/0", send, retry=RetryConfig(initial_interval_s=0.01))
    queue.start()
    for i in range(4):
        queue.offer(i, 5)
    started = time.monotonic()
    assert queue.stop(0.2)
    assert time.monotonic() - started < 1.0
    assert queue.stats()[:5] == (0, 20, 0, 0, 256)


def test_queue_permanent_unexpected_and_no_retry() -> None:
    calls: list[int] = []

    def send(item: int) -> None:
        calls.append(item)
        if item == 0:
            raise PermanentError("bad")
        if item == 1:
            raise ValueError("a bug")
        if item == 2:
            raise RetryableError("down")

    queue: ExporterQueue[int] = ExporterQueue("test/0", send, retry=RetryConfig(enabled=False))
    queue.start()
    for i in range(4):
        queue.offer(i, 1)
    wait_for(lambda: sum(queue.stats()[:2]) == 4)
    assert calls == [0, 1, 2, 3]
    assert queue.stats()[:3] == (1, 3, 0)
    queue.stop(1.0)


def test_queue_retry_after_beyond_max_elapsed_gives_up_at_once() -> None:
    def send(item: int) -> None:
        raise RetryableError("throttled", retry_after_s=60.0)

    queue: ExporterQueue[int] = ExporterQueue("test/0", send, retry=RetryConfig(max_elapsed_time_s=1.0))
    queue.start()
    queue.offer(0, 3)
    wait_for(lambda: queue.stats().send_failed == 3, timeout_s=0.8)  # not the 1 s max elapsed
    queue.stop(1.0)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: RemoteWriteConfig("ftp://host/write"), "ftp://host/write"),
        (lambda: RemoteWriteConfig("localhost:9090/api/v1/write"), "localhost:9090"),
        (lambda: RemoteWriteConfig("http:///api/v1/write"), "http:///api/v1/write"),
        (lambda: RemoteWriteConfig("http://h:99999/x"), "99999"),
        (lambda: RemoteWriteConfig("http://h/x", timeout_s=0), "timeout_s"),
        (lambda: RemoteWriteConfig("http://h/x", max_samples_per_send=0), "max_samples_per_send"),
        (lambda: RemoteWriteConfig("http://h/x", headers=(("Content-Encoding", "gzip"),)), "Content-Encoding"),
        (lambda: RemoteWriteConfig("http://h/x", headers=(("X-A", "b\r\nc"),)), "X-A"),
        (lambda: RemoteWriteConfig("http://h/x", name=""), "name"),
        (lambda: QueueConfig(queue_size=0), "queue_size"),
        (lambda: RetryConfig(initial_interval_s=-1), "initial_interval_s"),
        (lambda: RetryConfig(multiplier=0.5), "multiplier"),
        (lambda: RetryConfig(max_interval_s=0.01), "max_interval_s"),
        (lambda: RetryConfig(randomization_factor=2), "randomization_factor"),
        (lambda: RetryConfig(max_elapsed_time_s=-1), "max_elapsed_time_s"),
    ],
)
def test_bad_config_names_the_value(make: Callable[[], object], named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("?", r"\?")) as info:
        make()
    assert named in str(info.value)


# ---------------------------------------------------------------- a real Prometheus


@pytest.mark.slow
def test_real_prometheus_receives_counter_histogram_exemplar_and_staleness(prometheus_server) -> None:
    server = prometheus_server(None, extra_flags=("--web.enable-remote-write-receiver",
                                                  "--enable-feature=exemplar-storage"))
    exporter = RemoteWriteExporter(RemoteWriteConfig(server.url + "/api/v1/write", retry=FAST_RETRY))
    exporter.start()
    now_ms = int(time.time() * 1000)
    ts = now_ms - 2000
    common = {"instance": "host-1:8000", "job": "otel-llm", "model_name": "m"}
    ex = PrwExemplar((("span_id", SPAN_ID), ("trace_id", TRACE_ID)), 0.42, ts)
    name = "vllm:e2e_request_latency_seconds"
    batch = [
        series("vllm:request_success_total", 41.0, ts, finished_reason="stop", **common),
        series("vllm:request_success_total", 1.0, ts, finished_reason="length", **common),
        series(f"{name}_bucket", 1.0, ts, le="0.1", **common),
        series(f"{name}_bucket", 3.0, ts, ex, le="0.5", **common),
        series(f"{name}_bucket", 4.0, ts, le="+Inf", **common),
        series(f"{name}_sum", 2.25, ts, **common),
        series(f"{name}_count", 4.0, ts, **common),
        series("otel_llm_test_gone", 1.0, ts, **common),
    ]
    exporter.export(batch)
    wait_for(lambda: exporter.stats().sent == len(batch))
    exporter.export([series("otel_llm_test_gone", STALE_NAN, now_ms - 1000, **common)])
    exporter.stop(5.0)
    assert exporter.stats()[:3] == (9, 0, 0)

    assert server.value("sum(vllm:request_success_total)") == 42.0
    assert server.value('vllm:request_success_total{finished_reason="length"}') == 1.0
    assert server.value(f'{name}_bucket{{le="0.5"}}') == 3.0
    assert server.value(f"{name}_sum / {name}_count") == 2.25 / 4
    assert server.value(f"histogram_quantile(0.5, {name}_bucket)") == pytest.approx(0.1 + 0.4 * (2 - 1) / 2)
    assert server.query("otel_llm_test_gone") == []  # the stale marker ended it
    assert server.value("count_over_time(otel_llm_test_gone[5m])") == 1.0

    query = urllib.parse.urlencode({"query": f"{name}_bucket", "start": (ts - 60_000) / 1000,
                                    "end": (now_ms + 60_000) / 1000})
    with urllib.request.urlopen(f"{server.url}/api/v1/query_exemplars?{query}", timeout=10) as response:
        data = json.loads(response.read())["data"]
    assert len(data) == 1 and data[0]["seriesLabels"]["le"] == "0.5"
    (exemplar,) = data[0]["exemplars"]
    assert exemplar["labels"] == {"span_id": SPAN_ID, "trace_id": TRACE_ID}
    assert float(exemplar["value"]) == 0.42
    assert exemplar["timestamp"] == ts / 1000


def test_public_surface() -> None:
    import otel_llm.collector.exporter.queue as queue_module
    import otel_llm.collector.exporter.remote_write.exporter as exporter_module
    import otel_llm.collector.exporter.remote_write.proto as proto_module

    assert sorted(exporter_module.__all__) == ["RemoteWriteConfig", "RemoteWriteExporter"]
    assert sorted(queue_module.__all__) == [
        "Batch", "ExporterQueue", "PermanentError", "QueueConfig", "QueueStats", "RetryConfig", "RetryableError",
    ]
    assert sorted(proto_module.__all__) == [
        "Exemplar", "Label", "MetricMetadata", "PrwExemplar", "PrwSeries", "STALE_NAN", "Sample",
        "TimeSeries", "WriteRequest", "decode_write_request", "encode_write_request",
    ]


def test_credentials_in_the_url_are_basic_auth_and_never_logged(receiver_factory, exporter_factory, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="otel_llm.collector.exporter.queue")
    rx = receiver_factory([(503, {}, b"busy")])
    url = rx.url.replace("http://", "http://tenant:s3cret%21@") + "?api_key=k3y"
    exporter = exporter_factory(url)
    exporter.export([series("x", 1.0)])
    wait_for(lambda: exporter.stats().sent == 1)
    assert rx.received[-1].headers["Authorization"] == "Basic " + base64.b64encode(b"tenant:s3cret!").decode()
    with Collector(CollectorConfig(otlp_http_port=0, otlp_grpc_port=None, prometheus_port=None,
                                   remote_write_urls=(url,))) as collector:
        shown = collector.describe() + caplog.text
    assert "remote-write http://xxxxx@127.0.0.1" in shown, shown
    assert "s3cret" not in shown and "k3y" not in shown and "tenant" not in shown
    assert redact_url(url) == rx.url.replace("http://", "http://xxxxx@") + "?api_key=xxxxx"
