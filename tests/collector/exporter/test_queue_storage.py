"""--storage-dir: the trace backends' queues in SQLite files. What the collector acknowledged
reaches the backend at least once across kill -9 and restarts; the storage itself in-process."""

from __future__ import annotations

import http.client
import threading
import time

import pytest

from benchmarks.collector_bench import CollectorProcess
from otel_llm.collector.exporter.queue_storage import SqliteStorage, storage_path
from otel_llm.collector.receiver.otlp_http import OtlpReceiver, OtlpReceiverConfig
from tests.collector.exporter.test_otlp import spans_request
from tests.harness import free_port
from tests.harness.memory_sink import MemorySink
from tests.server.api.api_server_harness import wait_until

SPANS = 50  # per request


def post(port: int, body: bytes) -> bool:
    """True when the collector acknowledged the request."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
        return conn.getresponse().status == 200
    except OSError:
        return False


def span_names(first_request: int, requests: int) -> set[str]:
    return {f"span {i}" for i in range(first_request * SPANS, (first_request + requests) * SPANS)}


@pytest.mark.slow
def test_nothing_acknowledged_is_lost_across_kill_9(tmp_path):
    backend_port = free_port()
    flags = ("--traces-to", f"http://127.0.0.1:{backend_port}/v1/traces", "--storage-dir", str(tmp_path / "q"))
    acked: set[str] = set()

    # 1. the backend is down: everything acknowledged waits on disk; then kill -9
    with CollectorProcess(*flags) as collector:
        for i in range(20):
            assert post(collector.http_port, spans_request(SPANS, first=SPANS * i))
            acked |= span_names(i, 1)
        collector.proc.kill()
        collector.proc.wait()

    sink = MemorySink()
    with OtlpReceiver(sink, OtlpReceiverConfig(port=backend_port)):
        # 2. the backend is up; the restarted collector is killed again while a client is sending
        with CollectorProcess(*flags) as collector:
            def send() -> None:
                for i in range(20, 80):
                    if post(collector.http_port, spans_request(SPANS, first=SPANS * i)):
                        acked.update(span_names(i, 1))

            sender = threading.Thread(target=send)
            sender.start()
            assert wait_until(lambda: len(acked) >= 40 * SPANS, timeout_s=30)
            resent = collector.counter("otel_llm_exporter_resent_spans")  # phase 1's in-flight batch
            collector.proc.kill()
            collector.proc.wait()
            sender.join()
        # 3. restarted once more: everything acknowledged arrives
        with CollectorProcess(*flags) as collector:
            assert wait_until(lambda: acked <= {s.name for s in sink.received_spans()}, timeout_s=30), \
                len(acked - {s.name for s in sink.received_spans()})
            time.sleep(0.5)  # anything sent twice has arrived too
            resent += collector.counter("otel_llm_exporter_resent_spans")  # phase 2's in-flight batch
    received = [s.name for s in sink.received_spans()]
    duplicates = len(received) - len(set(received))
    print(f"acknowledged {len(acked)} spans, received {len(received)}, duplicates {duplicates}, "
          f"counted as resent {resent}")
    assert set(received) <= span_names(0, 80)  # nothing made up
    assert duplicates % SPANS == 0  # only whole requests that were in flight at a kill are sent twice
    assert duplicates <= resent  # and the collector counted them


def test_storage_keeps_order_batches_and_what_was_in_flight(tmp_path):
    path = storage_path(tmp_path, "traces", "http://b:4318/v1/traces")
    store = SqliteStorage(path)
    for i in range(5):
        store.put(f"item{i}".encode(), 10, 5)
    assert (store.count, store.bytes) == (5, 25)
    first = store.take(25)
    assert first.items == [b"item0", b"item1"] and first.records == 20
    store.done(first.key)
    in_flight = store.take(None)
    assert in_flight.items == [b"item2"] and store.count == 2
    assert store.clear() == 0  # nothing is dropped at shutdown: it stays on disk
    store.close()
    again = SqliteStorage(path)  # a restart: what was in flight comes back first
    assert again.count == 3 and again.recovered_records == 30
    assert again.resent_records == 10  # item2 was in flight: its backend may see it twice
    assert again.take(100).items == [b"item2", b"item3", b"item4"]
    again.put(b"item5", 1, 1)
    assert again.take(100).items == [b"item5"]  # ids keep growing after deletes
    again.close()


def test_one_process_per_queue_file(tmp_path):
    path = storage_path(tmp_path, "traces", "grpc://b:4317")
    first = SqliteStorage(path)
    with pytest.raises(OSError, match="in use by another process"):
        SqliteStorage(path)
    first.close()
    SqliteStorage(path).close()
