"""The real `openai` client against the real server (dummy model, engine process)."""

from __future__ import annotations

import httpx
import openai
import pytest
from api_server_harness import sample, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(shared_server):
    with openai.OpenAI(base_url=f"{shared_server.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["dummy"]


def test_completion(client):
    r = client.completions.create(model="dummy", prompt="Hello there", max_tokens=6,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len("Hello there".encode())  # byte-level tokenizer
    assert r.usage.completion_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_chat(client):
    r = client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=5, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens > 2  # the chat template adds tokens


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(
        model="dummy", messages=[{"role": "user", "content": "stream please"}], max_tokens=9, stream=True,
        stream_options={"include_usage": True}, temperature=0, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert all(c.usage is None for c in chunks[:-1])
    # greedy streaming and non-streaming agree
    r = client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "stream please"}],
                                       max_tokens=9, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == text


def test_completion_stream(client):
    stream = client.completions.create(model="dummy", prompt="abc", max_tokens=7, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_n2(client):
    r = client.completions.create(model="dummy", prompt="fork me", max_tokens=4, n=2, temperature=1.0, seed=3,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 8
    stream = client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "two"}], n=2,
                                            max_tokens=3, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}
    assert chunks[-1].usage.completion_tokens == 6


def test_seed_is_reproducible(client):
    texts = {client.completions.create(model="dummy", prompt="seeded", max_tokens=8, temperature=1.0, seed=42,
                                       extra_body={"ignore_eos": True}).choices[0].text for _ in range(2)}
    assert len(texts) == 1


@pytest.mark.parametrize("as_list", [False, True])
def test_stop_string(client, as_list):
    base = client.completions.create(model="dummy", prompt="The stop test", max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    printable = [i for i in range(4, len(base) - 2) if base[i:i + 2].isprintable() and base[i:i + 2].strip()]
    if not printable:
        pytest.skip(f"greedy dummy output has no printable pair to stop on: {base!r}")
    i = printable[0]
    stop = base[i:i + 2]
    r = client.completions.create(model="dummy", prompt="The stop test", max_tokens=24, temperature=0,
                                  stop=[stop] if as_list else stop, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[:base.index(stop)]


def test_closing_a_stream_aborts_the_request(client, shared_server):
    before = sample(shared_server.metrics(), "vllm:request_success_total", finished_reason="abort")
    stream = client.completions.create(model="dummy", prompt="never ending", max_tokens=2000, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    aborted = wait_until(lambda: sample(shared_server.metrics(), "vllm:request_success_total",
                                        finished_reason="abort") == before + 1)
    assert aborted
    assert wait_until(lambda: sample(shared_server.metrics(), "vllm:num_requests_running") == 0)
    assert shared_server.health().json()["in_flight"] == 0


def test_many_concurrent_streams(shared_server):
    """Async streaming end to end: 24 concurrent streams complete with their own usage."""
    import asyncio

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{shared_server.url}/v1", api_key="x", max_retries=0) as c:
            async def one(i):
                s = await c.chat.completions.create(
                    model="dummy", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=5 + i % 4,
                    stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                return [ch async for ch in s][-1].usage.completion_tokens

            return await asyncio.gather(*(one(i) for i in range(24)))

    assert asyncio.run(run()) == [5 + i % 4 for i in range(24)]


def test_traceparent_accepted_without_exporter(shared_server):
    r = httpx.post(f"{shared_server.url}/v1/completions", timeout=30,
                   headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                   json={"model": "dummy", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 200


def test_dropping_a_non_streaming_request_aborts_it(shared_server):
    before = sample(shared_server.metrics(), "vllm:request_success_total", finished_reason="abort")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(f"{shared_server.url}/v1/completions", timeout=httpx.Timeout(5, read=0.3),
                   json={"model": "dummy", "prompt": "slow", "max_tokens": 2000, "ignore_eos": True})
    assert wait_until(lambda: sample(shared_server.metrics(), "vllm:request_success_total",
                                     finished_reason="abort") == before + 1)
    assert wait_until(lambda: shared_server.health().json()["in_flight"] == 0)
