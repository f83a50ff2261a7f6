"""`--in-process`: the same interfaces with the engine in a thread of the API process."""

from __future__ import annotations

import openai
import pytest
from api_server_harness import ServerProcess, sample, wait_until

from otel_llm.server.engine_process import engine_pids

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--in-process", "--served-model-name", "tiny").start()
    yield srv
    srv.stop()


def test_in_process_serving(server):
    assert engine_pids(server.proc.pid) == []  # no engine process: a thread of the API process
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
        assert [m.id for m in c.models.list().data] == ["tiny"]
        r = c.completions.create(model="tiny", prompt="in process", max_tokens=5, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 5
        chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                max_tokens=4, stream=True, stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True}))
        assert chunks[-1].usage.completion_tokens == 4
        stream = c.completions.create(model="tiny", prompt="abort me", max_tokens=2000, stream=True,
                                      extra_body={"ignore_eos": True})
        next(iter(stream))
        stream.close()
    assert wait_until(lambda: sample(server.metrics(), "vllm:request_success_total", finished_reason="abort") == 1)
    m = server.metrics()
    assert sample(m, "vllm:request_success_total", finished_reason="length", model_name="tiny") == 2
    assert sample(m, "vllm:prompt_tokens_total") == r.usage.prompt_tokens + chunks[-1].usage.prompt_tokens + \
        len("abort me".encode())
