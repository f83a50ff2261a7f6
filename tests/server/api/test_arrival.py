"""Arrival is stamped when uvicorn reads a request, not when the app gets to run it."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from server.api.arrival import ArrivalStamp, stamping_protocol

BLOCK_S = 0.15


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    seen: dict[str, tuple[int, int]] = {}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        started = time.monotonic_ns()
        time.sleep(BLOCK_S)  # holds the event loop: requests read meanwhile wait for their turn
        seen[scope["query_string"].decode()] = (scope["state"]["arrival_ns"], started)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    port = _free_port()
    config = uvicorn.Config(ArrivalStamp(app), host="127.0.0.1", port=port, http=stamping_protocol(),
                            log_level="warning", lifespan="off")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", seen
    srv.should_exit = True
    thread.join(timeout=10)


def test_arrival_is_stamped_when_the_request_is_read(server):
    """While request 0 holds the loop, requests 1 and 2 arrive on open connections; the loop
    then reads both in one pass and runs them one after the other. The second to run waited ~BLOCK_S for the
    first, and its arrival stamp (taken when it was read) shows that wait."""
    url, seen = server
    clients = [httpx.Client(timeout=10) for _ in range(3)]
    for i, c in enumerate(clients[1:], 1):  # open the connections first, like a pooled client
        c.get(f"{url}/?warm{i}")
    status = []

    def get(i):
        status.append(clients[i].get(f"{url}/?{i}").status_code)

    threads = [threading.Thread(target=get, args=(0,))]
    threads[0].start()
    time.sleep(BLOCK_S / 3)  # request 0 is running and holding the loop
    threads += [threading.Thread(target=get, args=(i,)) for i in (1, 2)]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    assert status == [200, 200, 200]
    waited = [seen[str(i)][1] - seen[str(i)][0] for i in (1, 2)]
    assert max(waited) >= 0.7 * BLOCK_S * 1e9  # stamped at read time, not when the app started
    assert min(waited) < 0.5 * BLOCK_S * 1e9  # the first to run started right after the read


def test_middleware_stamps_when_no_server_did():
    import asyncio

    seen = {}

    async def app(scope, receive, send):
        seen["state"] = dict(scope["state"])

    before = time.monotonic_ns()
    asyncio.run(ArrivalStamp(app)({"type": "http"}, None, None))
    assert seen["state"]["arrival_ns"] >= before
    asyncio.run(ArrivalStamp(app)({"type": "http", "state": {"arrival_ns": 5}}, None, None))
    assert seen["state"]["arrival_ns"] == 5  # an earlier stamp (the server's) wins
