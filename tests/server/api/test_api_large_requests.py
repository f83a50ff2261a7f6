"""Large requests: a body over `--max-request-bytes` is refused (413, OpenAI's error JSON) before it
is read, and a large prompt under the limit is tokenized off the event loop, so other requests
keep being served meanwhile."""

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


def test_large_prompt_is_tokenized_off_the_event_loop():
    # 4 M characters (the default limit is 4 MiB): tokenizing them takes seconds. /health is
    # polled throughout and must keep answering promptly.
    srv = ServerProcess().start()
    try:
        result = {}
        prompt = "the quick brown fox " * 200_000

        def big():
            result["r"] = httpx.post(f"{srv.url}/v1/completions", timeout=120,
                                     json={"model": "dummy", "prompt": prompt, "max_tokens": 1})

        thread = threading.Thread(target=big)
        thread.start()
        latencies = []
        while thread.is_alive():
            started = time.monotonic()
            assert srv.health().status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)
        thread.join()
        r = result["r"]
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text  # longer than the context
        assert len(latencies) >= 5, latencies  # the big request took a while: polled throughout it
        assert max(latencies) < 1.0, latencies  # the old code answered nothing for the whole tokenization
    finally:
        srv.stop()
