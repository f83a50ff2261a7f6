"""Header and body read timeouts (`read_timeouts.timed_protocol`): a client that opens a socket and
sends nothing, trickles its headers, or stops sending its body is closed and counted; a client that
sends its requests whole, on a kept-alive connection, with pauses, or waiting for a slow answer, is
not. Through a real uvicorn server with the server's own protocol stack, on raw sockets, with
deadlines of a fraction of a second; then the flags and the counter through `otel-llm serve`."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvicorn
from api_server_harness import ServerProcess, free_port, sample

from otel_llm.server.api.arrival import stamping_protocol
from otel_llm.server.api.read_timeouts import ReadTimeouts, timed_protocol
from tests.harness.uvicorn_thread import serving

HEADER_S = 0.5
BODY_S = 0.5
CLOSED_WITHIN_S = 10.0  # generous: "closed at all", not how fast
REQUEST = b"GET /?fast HTTP/1.1\r\nHost: t\r\n\r\n"


async def _app(scope, receive, send):
    """Answers after reading the whole body; `?slow` answers after 3 deadlines."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["query_string"] == b"slow":
        await asyncio.sleep(3 * max(HEADER_S, BODY_S))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server():
    timeouts = ReadTimeouts(HEADER_S, BODY_S)
    port = free_port()
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                            http=timed_protocol(stamping_protocol(), timeouts))
    with serving(config):
        yield port, timeouts


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN_S)


def _closed_by_server(sock: socket.socket) -> bool:
    """Reads until the server closes (True) or CLOSED_WITHIN_S passes without it (False)."""
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def _answer(sock: socket.socket, body_length: int = 0) -> bytes:
    """One whole response on `sock`."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < body_length:
        chunk = sock.recv(4096)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def test_an_idle_socket_is_closed(server):
    port, timeouts = server
    with _connect(port) as sock:
        assert _closed_by_server(sock)
    assert timeouts.counts == {"header": 1, "body": 0}


def test_headers_trickled_a_byte_at_a_time_are_closed(server):
    port, timeouts = server
    with _connect(port) as sock:
        sent = 0
        try:  # a byte every fifth of the deadline: each byte alone is in time, the headers are not
            for byte in REQUEST[:-4]:
                sock.sendall(bytes([byte]))
                sent += 1
                time.sleep(HEADER_S / 5)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert sent < len(REQUEST) - 4
        assert _closed_by_server(sock)
    assert timeouts.counts == {"header": 1, "body": 0}


def test_a_body_that_stops_short_is_closed(server):
    port, timeouts = server
    with _connect(port) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
        assert _closed_by_server(sock)
    assert timeouts.counts == {"header": 0, "body": 1}


def test_a_kept_alive_client_with_pauses_and_slow_answers_is_served(server):
    port, timeouts = server
    with _connect(port) as sock:
        for i in range(4):  # 4 requests over several deadlines on one connection
            body = b"b" * (i + 1)
            sock.sendall(b"POST /?%s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                         % (b"slow" if i == 1 else b"fast", len(body), body))
            assert _answer(sock, len(body)).endswith(b"\r\n\r\n" + body)
            time.sleep(HEADER_S * 0.6)
        # headers and body in two writes, each well within its deadline
        sock.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\n")
        time.sleep(BODY_S / 5)
        sock.sendall(b"end")
        assert _answer(sock, 3).endswith(b"end")
    assert timeouts.counts == {"header": 0, "body": 0}


@pytest.mark.slow
def test_serve_flags_close_slow_clients_and_count_them_on_metrics():
    server = ServerProcess("--header-timeout", "0.5", "--body-timeout", "0.5").start()
    try:
        with _connect(server.port) as idle, _connect(server.port) as short:
            short.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n" + b'{"model": ')
            assert _closed_by_server(idle) and _closed_by_server(short)
        m = server.metrics()  # a client that sends whole requests is unaffected
        assert sample(m, "otel_llm_http_read_timeouts_total", phase="header") == 1
        assert sample(m, "otel_llm_http_read_timeouts_total", phase="body") == 1
        assert "Exception" not in server.output()  # the handler waiting for the body saw a disconnect
    finally:
        server.stop()
