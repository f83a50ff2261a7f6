"""The OTLP receiver that takes the telemetry-on server's spans, counting them, in its own process."""

from __future__ import annotations

import threading
import time


class _CountingSink:
    """Counts received spans and their names; no per-span records (a collector costs CPU,
    and on a 2-core machine it would be taken from the telemetry-on server)."""

    def __init__(self):
        self.spans, self.names, self._lock = 0, set(), threading.Lock()

    def __call__(self, signal, payload: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        if signal.value != "traces":
            return
        request = ExportTraceServiceRequest.FromString(payload)
        spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        with self._lock:
            self.spans += len(spans)
            self.names.update(s.name for s in spans)

    def stats(self) -> tuple[int, list[str], int]:
        with self._lock:
            return self.spans, sorted(self.names), 0


def _receiver_main(conn) -> None:
    from otel_llm.collector.receiver.otlp_http import OtlpReceiver

    sink = _CountingSink()
    with OtlpReceiver(sink) as rx:
        conn.send(rx.endpoint)
        while conn.recv() == "stats":
            conn.send(sink.stats())


class ReceiverProcess:
    """The OTLP receiver (otel_llm.collector.receiver.otlp_http, counting spans) in its own process, like a
    real collector: its decoding never competes with this client for the GIL."""

    def __enter__(self) -> "ReceiverProcess":
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_receiver_main, args=(child,), daemon=True)
        self._proc.start()
        self.pid = self._proc.pid
        self.endpoint = self._conn.recv()
        return self

    def stats(self) -> tuple[int, list[str], int]:
        """(spans received, distinct span names, spans dropped: always 0 here)."""
        self._conn.send("stats")
        return self._conn.recv()

    def __exit__(self, *exc) -> None:
        self._conn.send("stop")
        self._proc.join(timeout=10)


def wait_spans(rx: ReceiverProcess, timeout_s: float, settle_s: float = 1.5) -> int:
    deadline = time.monotonic() + timeout_s
    count, last_change = rx.stats()[0], time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        n = rx.stats()[0]
        if n != count:
            count, last_change = n, time.monotonic()
        elif count and time.monotonic() - last_change >= settle_s:
            break
    return count
