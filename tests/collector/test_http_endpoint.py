"""Every HTTP listener of a real Collector (OTLP/HTTP, /metrics, the Jaeger query API) under slow,
idle and too many clients: deadlines per phase, idle connections making room, 503s read as
answers, a backlog for a fleet; each counted on the collector's own /metrics."""

import http.client
import io
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from otel_llm.collector.http_connection import read_headers
from otel_llm.collector.http_endpoint import HttpServerSettings
from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.collector.tracestore.store import TraceStoreConfig
from tests.collector.receiver.test_otlp_http import one_span_protobuf

SHORT = HttpServerSettings(max_connections=3, header_timeout_s=0.5, body_timeout_s=0.5, idle_timeout_s=0.5)
LISTENERS = ("otlp_http", "prometheus", "jaeger_query")


@pytest.fixture
def collector(tmp_path) -> Iterator[Collector]:
    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=None, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(tmp_path)), http_server=SHORT)
    with Collector(config) as collector:
        yield collector


def address(collector: Collector, listener: str) -> tuple[str, int]:
    endpoint = {"otlp_http": collector.http.server, "prometheus": collector.scrape, "jaeger_query": collector.jaeger}
    return "127.0.0.1", endpoint[listener].port


def closed_count(collector: Collector, listener: str, reason: str) -> int:
    text = collector.render().decode()
    line = f'otel_llm_collector_connections_closed_total{{listener="{listener}",reason="{reason}"}} '
    return int(float(next(row for row in text.splitlines() if row.startswith(line)).split()[-1]))


def closed_within(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the server closes `sock` (it sends nothing first); fails after limit_s."""
    sock.settimeout(limit_s)
    start = time.monotonic()
    assert sock.recv(1024) == b""
    return time.monotonic() - start


def trickle(sock: socket.socket, data: bytes, every_s: float = 0.1) -> None:
    """Sends one byte every `every_s` until the server closes the connection."""
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return
        time.sleep(every_s)


@pytest.mark.parametrize("listener", LISTENERS)
def test_headers_trickled_a_byte_at_a_time_are_cut_at_the_header_deadline(collector, listener) -> None:
    with socket.create_connection(address(collector, listener)) as sock:
        start = time.monotonic()
        trickle(sock, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200)
        assert time.monotonic() - start < 5  # a per-read timeout (10 s) never fires: each byte resets it
    assert closed_count(collector, listener, "header_timeout") == 1


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_connection_that_never_sends_is_closed(collector, listener) -> None:
    with socket.create_connection(address(collector, listener)) as sock:
        closed_within(sock, 5)
    assert closed_count(collector, listener, "header_timeout") == 1


def test_a_body_short_of_its_content_length_is_cut_at_the_body_deadline(collector) -> None:
    with socket.create_connection(address(collector, "otlp_http")) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                     b"Content-Length: 1000\r\n\r\n0123456789")
        closed_within(sock, 5)
    with socket.create_connection(address(collector, "otlp_http")) as sock:  # and a trickled one
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                     b"Content-Length: 1000\r\n\r\n")
        start = time.monotonic()
        trickle(sock, b"x" * 1000)
        assert time.monotonic() - start < 5
    assert closed_count(collector, "otlp_http", "body_timeout") == 2
    assert collector.http.stats().accepted == 0


def test_keep_alive_clients_are_served_and_idle_ones_closed(collector) -> None:
    conn = http.client.HTTPConnection(*address(collector, "otlp_http"), timeout=5)
    for _ in range(3):  # one connection, three requests
        conn.request("POST", "/v1/traces", one_span_protobuf(), {"Content-Type": "application/x-protobuf"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Connection") is None
        response.read()
    closed_within(conn.sock, 5)  # then, idle past idle_timeout_s
    conn.close()
    assert closed_count(collector, "otlp_http", "idle_closed") == 1
    assert closed_count(collector, "otlp_http", "header_timeout") == 0


def test_a_new_connection_takes_the_place_of_an_idle_one_else_gets_503(tmp_path) -> None:
    settings = HttpServerSettings(max_connections=2, idle_timeout_s=60)
    with Collector(CollectorConfig(otlp_http_port=0, otlp_grpc_port=None, prometheus_port=0,
                                   http_server=settings)) as collector:
        host_port = address(collector, "prometheus")
        idle = http.client.HTTPConnection(*host_port, timeout=5)
        idle.request("GET", "/metrics")
        idle.getresponse().read()  # now an idle keep-alive connection
        silent = socket.create_connection(host_port)  # holds the other slot, mid-headers
        try:
            time.sleep(0.2)
            with urllib.request.urlopen(f"http://{host_port[0]}:{host_port[1]}/metrics", timeout=5) as response:
                assert response.status == 200  # the idle connection made room
            closed_within(idle.sock, 5)
            time.sleep(0.3)  # the answered connection's thread ends and frees its slot
            held = http.client.HTTPConnection(*host_port, timeout=5)
            held.connect()  # both slots busy, neither idle
            time.sleep(0.2)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://{host_port[0]}:{host_port[1]}/metrics", timeout=5)
            assert (refused.value.code, refused.value.headers["Retry-After"]) == (503, "1")
            held.close()
        finally:
            silent.close()
            idle.close()
        assert closed_count(collector, "prometheus", "idle_closed") == 1
        assert closed_count(collector, "prometheus", "refused") == 1


def test_the_backlog_holds_a_fleet_connecting_while_the_listener_is_busy() -> None:
    """200 connections that arrive while nothing accepts all complete their handshake (the standard
    library's backlog of 5 lets about 6 in; the rest wait for SYN retries, seconds each)."""
    with Collector(CollectorConfig(otlp_http_port=0, otlp_grpc_port=None, prometheus_port=None)) as collector:
        receiver = collector.http.server
        receiver._server.shutdown()  # the listening socket stays open; nothing accepts
        sockets = []
        try:
            for _ in range(200):
                sock = socket.socket()
                sock.settimeout(1.0)
                sock.connect(("127.0.0.1", receiver.port))  # times out once the queue is full
                sockets.append(sock)
        finally:
            for sock in sockets:
                sock.close()
        assert len(sockets) == 200


HEADER_BLOCKS = (
    b"Host: a\r\nContent-Type: application/x-protobuf\r\nContent-Length: 12\r\n\r\n",
    b"host:a\r\nX-Empty:\r\nX-Spaces: \t  v  \r\nX-Twice: 1\r\nx-twice: 2\r\n\r\n",  # as the parser keeps them
    b"Host: a\nLF-Only: yes\n\n",
    b"X-Latin: caf\xe9\r\nX-Colons: a:b:c\r\n\r\n",
    b"Folded: first\r\n  second\r\nAfter: x\r\n\r\n",  # obsolete folding: the standard library's parser
    b"No colon here\r\nHost: a\r\n\r\n",
    b": no name\r\nHost: a\r\n\r\n",
    b"Bad Name: x\r\nHost: a\r\n\r\n",
    b"Host : a\r\nAfter: x\r\n\r\n",
    b"Caf\xe9: x\r\nHost: a\r\n\r\n",
    b"Ctl\x7f: x\r\nHost: a\r\n\r\n",
    b"\r\n",
    b"Host: a\r\n",  # the stream ends before the empty line
)


@pytest.mark.parametrize("block", HEADER_BLOCKS)
def test_header_blocks_read_as_the_standard_library_reads_them(block: bytes) -> None:
    ours, theirs = read_headers(io.BytesIO(block)), http.client.parse_headers(io.BytesIO(block))
    assert ours.items() == theirs.items()
    for name in ("host", "content-type", "content-length", "x-twice", "folded", "after", "x-spaces"):
        assert ours.get(name) == theirs.get(name) and ours.get_all(name) == theirs.get_all(name)
    assert ours.get_content_type() == theirs.get_content_type()


@pytest.mark.parametrize("block", [b"X-Long: " + b"a" * n + b"\r\n\r\n" for n in (65_526, 65_527)]
                         + [b"".join(b"X-%d: v\r\n" % i for i in range(n)) + b"\r\n" for n in (99, 100)])
def test_header_limits_are_the_standard_librarys(block: bytes) -> None:
    try:
        theirs = http.client.parse_headers(io.BytesIO(block)).items()
    except http.client.HTTPException as exc:
        with pytest.raises(type(exc)):
            read_headers(io.BytesIO(block))
    else:
        assert read_headers(io.BytesIO(block)).items() == theirs


def raw_exchange(collector: Collector, request: bytes) -> bytes:
    with socket.create_connection(address(collector, "otlp_http"), timeout=5) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_requests_off_the_fast_path_are_answered_as_before(collector) -> None:
    body = one_span_protobuf()
    post = (b"POST /v1/traces HTTP/1.0\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n"
            b"X-Folded: a\r\n b\r\n\r\n" % len(body)) + body
    answer = raw_exchange(collector, post)  # HTTP/1.0, a folded header: answered, then closed
    assert answer.startswith(b"HTTP/1.1 200 ") and b"Content-Type: application/x-protobuf" in answer
    # refused by http.server's own parsing (its error page, without a status line: it never read a version)
    assert b"Error code: 505" in raw_exchange(collector, b"POST /v1/traces HTTP/2.0\r\n\r\n")
    assert b"Error code: 400" in raw_exchange(collector, b"POST /v1/traces HTTP/1.x\r\n\r\n")
    assert b"Error code: 400" in raw_exchange(collector, b"POST /v1/traces\r\n\r\n")
    too_many = b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n"
    assert raw_exchange(collector, too_many).startswith(b"HTTP/1.1 431 ")


def test_a_keep_alive_connection_serves_requests_with_their_body_in_one_write(collector) -> None:
    body = one_span_protobuf()
    request = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
    with socket.create_connection(address(collector, "otlp_http"), timeout=5) as sock:
        for _ in range(3):
            sock.sendall(request)
            answer = sock.recv(65536)  # headers and body of a small answer arrive together
            head, _, rest = answer.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            assert head.startswith(b"HTTP/1.1 200 ") and len(rest) == length


def test_the_date_header_is_the_current_second() -> None:
    from email.utils import parsedate_to_datetime

    from otel_llm.collector.http_connection import EndpointHandler

    handler = EndpointHandler.__new__(EndpointHandler)
    before = int(time.time())
    first, again = handler.date_time_string(), handler.date_time_string()
    assert first == again and before <= parsedate_to_datetime(first).timestamp() <= time.time()
    assert handler.date_time_string(0) == "Thu, 01 Jan 1970 00:00:00 GMT"
