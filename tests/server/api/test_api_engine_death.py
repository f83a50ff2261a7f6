"""The engine process dies under a request: the request fails with a 5xx OpenAI error,
`/health` turns 503 with the reason, new requests get 503, the failure is counted."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import pytest
from api_server_harness import ServerProcess, sample, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def server():
    srv = ServerProcess().start()
    yield srv
    srv.stop()


def test_engine_killed_mid_request(server):
    pid = server.health().json()["engine_pid"]
    assert pid and pid != server.proc.pid
    os.kill(pid, signal.SIGSTOP)  # hold the request inside the engine deterministically
    result = {}

    def request():
        result["r"] = httpx.post(f"{server.url}/v1/completions", timeout=60,
                                 json={"model": "dummy", "prompt": "doomed", "max_tokens": 50})

    t = threading.Thread(target=request)
    t.start()
    assert wait_until(lambda: server.health().json()["in_flight"] == 1)
    os.kill(pid, signal.SIGKILL)
    t.join(timeout=30)
    r = result["r"]
    assert 500 <= r.status_code < 600
    err = r.json()["error"]
    assert "engine" in err["message"] and err["type"]

    health = server.health()
    assert health.status_code == 503
    assert "exit code -9" in health.json()["reason"]
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 503

    again = httpx.post(f"{server.url}/v1/chat/completions", timeout=10,
                       json={"model": "dummy", "messages": [{"role": "user", "content": "hi"}]})
    assert again.status_code == 503 and "engine" in again.json()["error"]["message"]
    # the in-flight request is counted as an error; the refused one never arrived
    m = server.metrics()
    assert sample(m, "vllm:request_success_total", finished_reason="error") == 1
    assert server.proc.poll() is None  # the API process keeps answering


def test_engine_killed_mid_stream(server):
    pid = server.health().json()["engine_pid"]
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={"model": "dummy", "prompt": "s", "max_tokens": 2000, "ignore_eos": True,
                            "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line)
        assert first.startswith("data: {")
        os.kill(pid, signal.SIGKILL)
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert any('"error"' in line and "engine" in line for line in rest)
    assert server.health().status_code == 503
