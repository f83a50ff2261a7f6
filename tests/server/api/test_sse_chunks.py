"""SSE chunking: a chunk for every step with new tokens, even when they do not complete a character."""

import asyncio
import json
from array import array
from types import SimpleNamespace

import pytest

from otel_llm.server import ipc
from otel_llm.server.api.serving import OpenAIServing, _Prepared


def out(text, tokens=1, finished=False):
    return ipc.SeqOutput(1, 0, array("i", [65] * tokens), text, finished, 1 if finished else -1, 3, 0)


async def batches():
    yield [out("")]  # a token that ends inside a UTF-8 character: no text yet
    yield [out("é")]
    yield [out("", tokens=0, finished=True)]  # a finish with no new token


def stream(chat: bool) -> list[dict]:
    p = _Prepared("req-1", "chat" if chat else "text_completion", [1, 2, 3], 8, 8, 1, 0.0, 1.0, 0, None, (),
                  False, True, True)

    async def collect():
        return [chunk async for chunk in OpenAIServing._sse(SimpleNamespace(model_name="m"), p, batches(), chat)]

    body = "".join(asyncio.run(collect()))
    events = [e.removeprefix("data: ") for e in body.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.parametrize("chat", [False, True])
def test_a_token_without_text_still_gets_its_chunk(chat):
    chunks = stream(chat)
    if chat:
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        chunks = chunks[1:]
        texts = [c["choices"][0]["delta"].get("content") for c in chunks[:-1]]
    else:
        texts = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert texts == ["", "é", None if chat else ""]  # the first token's chunk is there, its text empty
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
