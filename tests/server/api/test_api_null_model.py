"""`--model null` through the real server: the whole stack at full speed (no forward pass), and
telemetry that still counts exactly what the clients were told."""

from __future__ import annotations

import asyncio
import string

import openai
import pytest
from api_server_harness import ServerProcess, sample, wait_until

pytestmark = pytest.mark.slow

NUM_EACH = 24  # requests of each kind, all in flight at once
MAX_TOKENS = 60
CYCLE = string.ascii_lowercase  # the null model's output, one token per letter


def expected_text(num_tokens: int) -> str:
    return (CYCLE * (num_tokens // len(CYCLE) + 1))[:num_tokens]


async def _one(client: openai.AsyncOpenAI, kind: str, i: int) -> tuple[str, int, str]:
    """(text, completion tokens, finish reason) of one request, as the client saw them."""
    common = {"model": "null", "max_tokens": MAX_TOKENS - i % 7}
    messages = [{"role": "user", "content": f"request {i}"}]
    usage = {"stream_options": {"include_usage": True}}
    if kind == "completion":
        r = await client.completions.create(prompt=f"request {i}", **common)
        return r.choices[0].text, r.usage.completion_tokens, r.choices[0].finish_reason
    if kind == "chat":
        r = await client.chat.completions.create(messages=messages, **common)
        return r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason
    if kind == "completion_stream":
        chunks = [c async for c in await client.completions.create(prompt=f"request {i}", stream=True, **usage,
                                                                   **common)]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        chunks = [c async for c in await client.chat.completions.create(messages=messages, stream=True, **usage,
                                                                        **common)]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reason = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    return text, chunks[-1].usage.completion_tokens, reason


async def _workload(url: str) -> list[tuple[str, int, str]]:
    kinds = ("completion", "chat", "completion_stream", "chat_stream")
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60) as client:
        results = await asyncio.gather(*(_one(client, kind, i) for kind in kinds for i in range(NUM_EACH)))
        stopped = await client.completions.create(model="null", prompt="x", max_tokens=MAX_TOKENS, stop=["klm"])
    return [*results, (stopped.choices[0].text, stopped.usage.completion_tokens, stopped.choices[0].finish_reason)]


def test_every_request_and_token_is_counted():
    server = ServerProcess("--model", "null", "--max-num-seqs", "128").start()
    try:
        results = asyncio.run(_workload(server.url))
        n = len(results)
        m = wait_until(lambda: (lambda m: m if sample(m, "vllm:request_success_total") == n else None)(
            server.metrics()))
        assert m, f"request_success_total never reached {n}"
    finally:
        server.stop()
    for text, tokens, reason in results[:-1]:
        assert (text, reason) == (expected_text(tokens), "length")
    assert results[-1] == ("abcdefghij", 13, "stop")  # "klm" is generated, then cut from the text
    assert sample(m, "vllm:request_success_total", model_name="null", finished_reason="length") == n - 1
    assert sample(m, "vllm:request_success_total", finished_reason="stop") == 1
    assert sample(m, "vllm:generation_tokens_total", model_name="null") == sum(t for _, t, _ in results)
    assert sample(m, "vllm:e2e_request_latency_seconds_count") == n
    assert sample(m, "vllm:time_to_first_token_seconds_count") == n
    assert sample(m, "vllm:num_requests_running") == 0
    assert sample(m, "otel_llm_telemetry_dropped_total") == 0
