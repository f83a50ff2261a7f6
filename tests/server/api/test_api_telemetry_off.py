"""`--disable-log-stats`: telemetry off, serving unchanged."""

from __future__ import annotations

import httpx
import openai
import pytest
from api_server_harness import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--disable-log-stats").start()
    yield srv
    srv.stop()


def test_serves_without_telemetry(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
        r = c.completions.create(model="dummy", prompt="quiet", max_tokens=3, n=2, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 6
        stream = c.completions.create(model="dummy", prompt="abort", max_tokens=2000, stream=True,
                                      extra_body={"ignore_eos": True})
        next(iter(stream))
        stream.close()
    m = httpx.get(f"{server.url}/metrics", timeout=10)
    assert m.status_code == 200 and "vllm:" not in m.text
    assert httpx.get(f"{server.url}/v2/models/stats", timeout=10).json() == {"model_stats": []}
    assert server.health().status_code == 200
