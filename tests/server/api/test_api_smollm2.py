"""SmolLM2-135M-Instruct end to end: the real model behind `otel-llm serve`, asked with the
real openai client (the GGUF is downloaded by `make setup`; never skipped)."""

import openai
import pytest
from api_server_harness import ServerProcess, sample

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server():
    # float32: in bf16 the top-2 first tokens tie (see tests/server/model/test_model_smollm2.py).
    server = ServerProcess("--model", "smollm2", "--dtype", "float32").start(timeout_s=300)
    yield server
    server.stop()


def test_smollm2_answers_paris_streamed_and_not(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    assert model == "smollm2"
    resp = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, temperature=0)
    assert "Paris" in resp.choices[0].message.content, resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "stop" and resp.usage.prompt_tokens == 37

    chunks = list(client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == resp.choices[0].message.content  # greedy: the same answer either way
    streamed = chunks[-1].usage

    metrics = server.metrics()
    assert sample(metrics, "vllm:request_success_total", finished_reason="stop") == 2
    assert sample(metrics, "vllm:prompt_tokens_total") == 2 * 37
    assert sample(metrics, "vllm:generation_tokens_total") == resp.usage.completion_tokens + streamed.completion_tokens
