"""Arrival is stamped when the kernel received a request, not when uvicorn read it or the app ran it."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from otel_llm.server.api.arrival import ArrivalStamp, _kernel_arrival_ns, stamping_protocol
from tests.harness.uvicorn_thread import serving

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
    with serving(config):
        yield f"http://127.0.0.1:{port}", seen


def test_arrival_is_when_the_kernel_received_the_request(server):
    """While request 0 holds the loop, requests 1 and 2 arrive on open connections and wait in
    the kernel until the loop reads them ~2/3 BLOCK_S later, then run one after the other. Their
    arrival stamps are when they were sent (the kernel's receive time, to its 4 ms tick), not
    when they were read or run."""
    url, seen = server
    clients = [httpx.Client(timeout=10) for _ in range(3)]
    for i, c in enumerate(clients[1:], 1):  # open the connections first, like a pooled client
        c.get(f"{url}/?warm{i}")
    status, sent = [], {}

    def get(i):
        sent[i] = time.monotonic_ns()
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
    tick = 5_000_000  # a jiffy (4 ms at HZ=250), and then some
    for i in (1, 2):
        arrival, started = seen[str(i)]
        assert sent[i] - tick <= arrival <= sent[i] + 0.2 * BLOCK_S * 1e9  # not when read (>= 0.6 BLOCK_S later)
    started = sorted(seen[str(i)][1] - sent[i] for i in (1, 2))
    assert started[0] >= 0.5 * BLOCK_S * 1e9 and started[1] >= 1.5 * BLOCK_S * 1e9  # they did wait for the loop


def test_kernel_arrival_falls_back_to_now_without_a_tcp_socket():
    class NoSocket:
        def get_extra_info(self, name):
            return None

    before = time.monotonic_ns()
    assert before <= _kernel_arrival_ns(NoSocket()) <= time.monotonic_ns()


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
