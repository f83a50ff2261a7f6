"""The engine process dies or hangs under load: its requests fail with OpenAI errors (streams get
an error event) that do not say why (an exit code, a hang: the log does), are counted as `error`, the engine's gauges drop to 0, `/health` says it is
restarting, and a new engine serves again (`--engine-restarts`), counted on `/metrics`. Past the
restart budget the server says it is dead, liveness included."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import openai
import pytest
from api_server_harness import ServerProcess, sample, wait_until

from otel_llm.server.api.serving import ENGINE_STOPPED, ENGINE_STOPPED_SERVING
from otel_llm.server.engine_process import engine_pids

pytestmark = pytest.mark.slow

STREAMS = 12
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def _stream(server, out: list) -> None:
    """One long stream; appends its non-empty SSE lines' list when it ends."""
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120,
                      json={"model": "dummy", "prompt": "s", "max_tokens": 2000, "ignore_eos": True,
                            "stream": True}) as r:
        out.append([line for line in r.iter_lines() if line])


def _wait_health(server, status: str, timeout_s: float = 60.0) -> dict:
    def check():
        body = server.health().json()
        return body if body["status"] == status else None
    body = wait_until(check, timeout_s)
    assert body, f"/health never said {status!r}: {server.health().json()}"
    return body


def test_killed_engine_fails_its_requests_zeroes_its_gauges_and_is_restarted():
    server = ServerProcess("--max-num-seqs", "8").start()  # 8 running, 4 waiting
    try:
        [pid] = engine_pids(server.proc.pid)
        ends: list = []
        threads = [threading.Thread(target=_stream, args=(server, ends)) for _ in range(STREAMS)]
        for t in threads:
            t.start()
        assert wait_until(lambda: sample(server.metrics(), "vllm:num_requests_running") == 8
                          and sample(server.metrics(), "vllm:num_requests_waiting") == 4, 30)
        os.kill(pid, signal.SIGKILL)
        for t in threads:
            t.join(60)
        assert len(ends) == STREAMS
        for lines in ends:  # every stream: an error event, then [DONE]; why the engine died is for the log
            assert lines[-1] == "data: [DONE]" and '"error"' in lines[-2]
            assert json.loads(lines[-2].removeprefix("data: "))["error"]["message"] == ENGINE_STOPPED_SERVING
        assert "exit code -9" in server.output()
        m = server.metrics()
        assert sample(m, "vllm:request_success_total", finished_reason="error") == STREAMS
        assert {name: sample(m, name) for name in GAUGES} == {name: 0 for name in GAUGES}  # not 8 / 4 / x%

        health = _wait_health(server, "ok")
        assert health["engine_restarts"] == 1
        [new_pid] = engine_pids(server.proc.pid)
        assert new_pid != pid
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:
            done = client.completions.create(model="dummy", prompt="again", max_tokens=5, extra_body={"ignore_eos": True})
        assert done.usage.completion_tokens == 5
        m = server.metrics()
        assert sample(m, "otel_llm_engine_restarts_total") == 1
        assert sample(m, "vllm:request_success_total", finished_reason="length") == 1
        assert "engine is dead" in server.output() and "engine restarted" in server.output()
    finally:
        server.stop()


def test_a_stream_cut_just_before_the_engine_dies_is_still_counted_as_abort():
    # The client cuts its stream; the server sends ABORT, but the engine (stopped) never reads it
    # and is killed: the request must still end (abort), not stay registered and uncounted.
    server = ServerProcess().start()
    try:
        [pid] = engine_pids(server.proc.pid)
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                          json={"model": "dummy", "prompt": "s", "max_tokens": 2000, "ignore_eos": True,
                                "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data:")
            os.kill(pid, signal.SIGSTOP)
        assert wait_until(lambda: server.health().json()["in_flight"] == 0, 30)  # its ABORT is in the pipe
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: server.health().json().get("engine_restarts") == 1, 60)
        m = server.metrics()
        assert sample(m, "vllm:request_success_total", finished_reason="abort") == 1
        assert sample(m, "vllm:request_success_total", finished_reason="error") == 0
        assert sample(m, "vllm:num_requests_running") == 0
        assert sample(m, "otel_llm_telemetry_dropped_total") == 0
    finally:
        server.stop()


def test_hung_engine_is_detected_failed_and_restarted():
    server = ServerProcess("--engine-heartbeat-timeout", "2").start()
    try:
        [pid] = engine_pids(server.proc.pid)
        os.kill(pid, signal.SIGSTOP)  # hung: alive, silent
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
            with pytest.raises(openai.InternalServerError) as raised:
                client.completions.create(model="dummy", prompt="stuck", max_tokens=5)
            assert raised.value.body["message"] == ENGINE_STOPPED_SERVING  # not "unresponsive ... 2.1 s": the log's
            assert "engine is dead: engine unresponsive" in server.output()
            health = server.health()
            if health.status_code == 503:  # still restarting: it says so, and why
                assert health.json()["status"] == "restarting" and "unresponsive" in health.json()["reason"]
            assert _wait_health(server, "ok")["engine_restarts"] == 1
            assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
            assert client.completions.create(model="dummy", prompt="x", max_tokens=3).choices[0].text
        assert sample(server.metrics(), "vllm:request_success_total", finished_reason="error") == 1
    finally:
        server.stop()


def test_past_the_restart_budget_the_server_says_it_is_dead():
    server = ServerProcess("--engine-restarts", "0").start()
    try:
        [pid] = engine_pids(server.proc.pid)
        os.kill(pid, signal.SIGKILL)
        health = _wait_health(server, "unhealthy")
        assert "exit code -9" in health["reason"] and health["engine_restarts"] == 0
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 503
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 503  # restart the server
        again = httpx.post(f"{server.url}/v1/chat/completions", timeout=10,
                           json={"model": "dummy", "messages": [{"role": "user", "content": "hi"}]})
        assert again.status_code == 503 and again.json()["error"]["message"] == ENGINE_STOPPED
        assert "exit code" not in again.text
        assert server.proc.poll() is None  # the API process keeps answering
    finally:
        server.stop()
