"""Large requests: a body over `--max-request-bytes` is refused (413, OpenAI's error JSON) before it
is read, and a prompt under the limit that is too long to fit the context is refused from its
length, before it is tokenized."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
from api_server_harness import ServerProcess

pytestmark = pytest.mark.slow

LIMIT = 100_000


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--max-request-bytes", str(LIMIT)).start()
    yield srv
    srv.stop()


def _raw_request(server, head: bytes, body: bytes = b"") -> tuple[int, dict]:
    """Send `head` and `body` on a fresh connection; the status and JSON body of the answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def test_declared_length_over_the_limit_is_refused_before_the_body_is_sent(server):
    # 50 MB declared, not a byte of it sent: the answer cannot have waited for the body.
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50000000\r\n\r\n")
    status, body = _raw_request(server, head)
    assert status == 413
    assert str(LIMIT) in body["error"]["message"] and body["error"]["code"] == 413


def test_a_client_that_sends_its_whole_body_first_still_gets_the_413(server):
    # httpx (and so the openai SDK) writes the declared body before it reads the answer: closed
    # with the body unread, the connection would be reset and the 413 lost.
    body = b'{"model": "dummy", "prompt": "' + b"x" * 5_000_000 + b'"}'

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(timeout=30) as client:
            return await client.post(f"{server.url}/v1/completions", content=body,
                                     headers={"Content-Type": "application/json"})

    for _ in range(3):
        r = asyncio.run(post())
        assert r.status_code == 413 and str(LIMIT) in r.json()["error"]["message"]


def test_chunked_body_over_the_limit_is_refused(server):
    def chunks():
        yield b'{"model": "dummy", "prompt": "'
        for _ in range(30):
            yield b"x" * 10_000
        yield b'", "max_tokens": 1}'

    r = httpx.post(f"{server.url}/v1/completions", content=chunks(), timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    # a body under the limit is served as before
    ok = httpx.post(f"{server.url}/v1/completions", timeout=30,
                    json={"model": "dummy", "prompt": "x" * 1000, "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_a_prompt_too_long_to_fit_is_refused_before_it_is_tokenized():
    # 3.5 M characters (under the default 4 MiB body limit): 3.5 M tokens for the dummy model's
    # byte tokenizer, which took 1 s and 146 MB to count. No token stands for more than 13
    # characters here, so they are at least 269,231 tokens: the 400 says so without tokenizing
    # (the exact count would mean it had). /health is polled throughout and keeps answering.
    srv = ServerProcess().start()
    try:
        result = {}
        text = "the quick brown fox " * 175_000
        requests = (("/v1/completions", {"model": "dummy", "prompt": text, "max_tokens": 1}, "prompt"),
                    ("/v1/completions", {"model": "dummy", "prompt": [text], "max_tokens": 1}, "prompt"),
                    ("/v1/chat/completions", {"model": "dummy", "messages": [{"role": "user", "content": text}]},
                     "messages"))

        def big():
            result["r"] = [httpx.post(f"{srv.url}{path}", timeout=120, json=body) for path, body, _ in requests]

        thread = threading.Thread(target=big)
        thread.start()
        while thread.is_alive():
            assert srv.health().status_code == 200
            time.sleep(0.05)
        thread.join()
        for r, (_, _, param) in zip(result["r"], requests):
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
            message = r.json()["error"]["message"]
            assert message.startswith("This model's maximum context length is 2048 tokens. However, your prompt "
                                      "is at least "), message
            assert int(message.split("at least ")[1].split()[0]) >= 3_500_000 // 13
        ok = httpx.post(f"{srv.url}/v1/completions", timeout=30,  # a prompt just under the floor is counted
                        json={"model": "dummy", "prompt": "x" * 3000, "max_tokens": 1})
        assert ok.status_code == 400 and "your prompt is 3000 tokens" in ok.json()["error"]["message"]
    finally:
        srv.stop()
