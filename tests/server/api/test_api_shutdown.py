"""SIGTERM ends the server with exit code 0 within `--shutdown-timeout` (default 15 s), however its
trace backend and engine behave: in-flight requests are aborted at half of it (their clients get
an error event), spans are flushed in what is left, and what could not be sent is logged."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import httpx
import pytest
from api_server_harness import ServerProcess, wait_until

from otel_llm.server.engine_process import engine_pids

pytestmark = pytest.mark.slow


def _stream(server, out: list) -> None:
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={"model": "dummy", "prompt": "s", "max_tokens": 1000, "stream": True}) as r:
        out.append([line for line in r.iter_lines() if line])


def test_sigterm_exits_0_within_the_default_timeout_behind_a_hung_backend_and_engine():
    backend = socket.create_server(("127.0.0.1", 0))  # a hung trace backend: it connects, never answers
    server = ServerProcess("--otlp-traces-endpoint", f"http://127.0.0.1:{backend.getsockname()[1]}/v1/traces",
                           env={"OTEL_BSP_SCHEDULE_DELAY": "100"}).start()
    try:
        for _ in range(20):  # spans for the exporter, whose first POST hangs
            assert httpx.post(f"{server.url}/v1/completions", timeout=30,
                              json={"model": "dummy", "prompt": "x", "max_tokens": 2}).status_code == 200
        [engine] = engine_pids(server.proc.pid)
        os.kill(engine, signal.SIGSTOP)  # requests in flight stay in flight; SHUTDOWN goes unanswered
        ends: list = []
        streams = [threading.Thread(target=_stream, args=(server, ends)) for _ in range(4)]
        for t in streams:
            t.start()
        assert wait_until(lambda: server.health().json()["in_flight"] == 4)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=30)
        took = time.monotonic() - started
        for t in streams:
            t.join(10)
        log = server.output()
        assert code == 0, log
        assert took < 15 + 1.5, (took, log)
        assert len(ends) == 4
        for lines in ends:  # each stream was ended with an error event, not cut
            assert lines[-1] == "data: [DONE]" and "shutting down" in lines[-2], lines
        assert "4 request(s) still in flight after 7.5 s; aborted" in log, log
        assert "export did not finish within --shutdown-timeout 15 s" in log, log
    finally:
        server.stop()
        backend.close()


def test_sigterm_with_nothing_in_flight_exits_0_at_once():
    server = ServerProcess().start()
    try:
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 5, server.output()
    finally:
        server.stop()


def test_sigterm_to_the_whole_process_group_drains_the_engine_instead_of_killing_it():
    """`timeout`, `kill -- -PGID` and systemd's default KillMode signal the engine too: it ignores
    SIGTERM and is shut down by the API process, so no "engine is dead" and no restart."""
    server = ServerProcess(own_group=True).start()
    try:
        with httpx.Client(timeout=30) as c:
            assert c.post(f"{server.url}/v1/completions",
                          json={"model": "dummy", "prompt": "hi", "max_tokens": 3}).status_code == 200
        os.killpg(server.proc.pid, signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        log = server.output()
        assert "engine is dead" not in log and "restarting the engine" not in log, log[-3000:]
    finally:
        server.stop()


def test_sigterm_behind_a_refusing_endpoint_does_not_wait_out_the_retry_back_off():
    # The last metrics export and the queued spans go to an endpoint that refuses connections:
    # each is tried once, not retried with the exporters' back-off (1 + 2 + 4 s), as before.
    refused = socket.create_server(("127.0.0.1", 0))
    port = refused.getsockname()[1]
    refused.close()
    server = ServerProcess(env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                                "OTEL_BSP_SCHEDULE_DELAY": "600000"}).start()  # spans wait for shutdown
    try:
        for _ in range(3):
            assert httpx.post(f"{server.url}/v1/completions", timeout=30,
                              json={"model": "dummy", "prompt": "x", "max_tokens": 2}).status_code == 200
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        took = time.monotonic() - started
        shutdown_log = server.output().partition("Shutting down")[2]
        assert "Failed to export metrics batch" in shutdown_log and "Failed to export spans batch" in shutdown_log
        assert "retrying in" not in shutdown_log, shutdown_log
        assert took < 5, (took, shutdown_log)  # as an idle server with no endpoint (it took 8 to 10 s)
    finally:
        server.stop()
