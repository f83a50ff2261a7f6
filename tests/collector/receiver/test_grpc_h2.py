"""The unary gRPC server under the OTLP/gRPC receiver: grpcio's own client end to end, and raw
HTTP/2 frames for what a well-behaved client never sends (bounds, timeouts, protocol errors)."""

import gzip
import logging
import socket
import struct
import time
from concurrent import futures

import grpc
import hpack
import pytest

from otel_llm.collector.extension.auth import BearerTokenAuth
from otel_llm.collector.http_endpoint import HttpServerSettings
from otel_llm.collector.receiver.grpc_h2 import (
    DATA,
    GOAWAY,
    HEADERS,
    MAX_CONCURRENT_STREAMS,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    GrpcError,
    Status,
    UnaryServer,
    frame,
)

ECHO, FAIL, CRASH = "/t.Test/Echo", "/t.Test/Fail", "/t.Test/Crash"


def _fail(message: bytes) -> bytes:
    raise GrpcError(Status.INVALID_ARGUMENT, "bad: " + message.decode() + " ünïcode 100%")


def _crash(message: bytes) -> bytes:
    raise RuntimeError("boom")


@pytest.fixture
def make_server():
    servers = []

    def make(settings=None, **kwargs) -> UnaryServer:
        server = UnaryServer({ECHO: lambda m: m[::-1], FAIL: _fail, CRASH: _crash}, settings=settings, **kwargs)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def _call(channel, path, payload, **kwargs):
    return channel.unary_unary(path, request_serializer=None, response_deserializer=None)(payload, timeout=10,
                                                                                          **kwargs)


def test_grpcio_client_calls_answers_errors_and_compression(make_server, caplog):
    server = make_server(max_message_bytes=4 << 20)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        assert _call(channel, ECHO, b"abc") == b"cba"
        assert _call(channel, ECHO, b"") == b""
        big = bytes(range(256)) * (3 << 12)  # 3 MiB: several windows of the stream and the connection
        for compression in (None, grpc.Compression.Gzip, grpc.Compression.Deflate):
            assert _call(channel, ECHO, big[:16000], compression=compression) == big[:16000][::-1]
        with pytest.raises(grpc.RpcError) as answer:  # answers must fit one frame: refused, clearly
            _call(channel, ECHO, big)
        assert answer.value.code() is grpc.StatusCode.INTERNAL and "does not fit" in answer.value.details()
        with pytest.raises(grpc.RpcError) as answer:
            _call(channel, FAIL, b"x")
        assert answer.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert answer.value.details() == "bad: x ünïcode 100%"
        with caplog.at_level(logging.ERROR), pytest.raises(grpc.RpcError) as answer:
            _call(channel, CRASH, b"x")
        assert answer.value.code() is grpc.StatusCode.INTERNAL and "boom" in caplog.text
        with pytest.raises(grpc.RpcError) as answer:
            _call(channel, "/t.Test/Nope", b"x")
        assert answer.value.code() is grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as answer:
            _call(channel, ECHO, b"y" * ((4 << 20) + 1))
        assert answer.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _call(channel, ECHO, b"still served") == b"devres llits"  # the same connection goes on


def test_many_calls_in_flight_beyond_the_stream_limit(make_server):
    server = make_server()
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        rpc = channel.unary_unary(ECHO, request_serializer=None, response_deserializer=None)
        calls = [rpc.future(b"%d" % i * 50, timeout=30) for i in range(4 * MAX_CONCURRENT_STREAMS)]
        assert [c.result() for c in calls] == [(b"%d" % i * 50)[::-1] for i in range(4 * MAX_CONCURRENT_STREAMS)]
    with futures.ThreadPoolExecutor(8) as pool:  # eight connections at once
        def one(i):
            with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                return _call(ch, ECHO, b"%d" % i)
        assert sorted(pool.map(one, range(8))) == sorted(b"%d" % i for i in range(8))


def test_authorization(make_server, tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    server = make_server(HttpServerSettings(auth=BearerTokenAuth(str(tmp_path / "token"))))
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as answer:
            _call(channel, ECHO, b"x")
        assert answer.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError):
            _call(channel, ECHO, b"x", metadata=(("authorization", "Bearer wrong"),))
        assert _call(channel, ECHO, b"x", metadata=(("authorization", "Bearer s3cret"),)) == b"x"
    assert server.unauthorized == 2


# -- raw frames -----------------------------------------------------------------------------------

class RawClient:
    def __init__(self, port: int, preface: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buffer = b""
        if preface:
            self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))

    def call_frames(self, stream_id: int, message: bytes, path: str = ECHO, end: bool = True,
                    headers=(), compressed: bool = False) -> bytes:
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                     (":authority", "x"), ("content-type", "application/grpc"), *headers])
        body = bytes((int(compressed),)) + len(message).to_bytes(4, "big") + message
        return frame(HEADERS, 0x4, stream_id, block) + frame(DATA, 0x1 if end else 0, stream_id, body)

    def frames(self, until, timeout: float = 10.0):
        """Reads frames until `until(kind, flags, stream_id, payload)` is true or the server closes;
        -> every frame read [(kind, flags, stream_id, payload)]."""
        seen, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            while len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) < 9 + length:
                    break
                kind, flags = self.buffer[3], self.buffer[4]
                stream_id = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
                payload, self.buffer = self.buffer[9:9 + length], self.buffer[9 + length:]
                seen.append((kind, flags, stream_id, payload))
                if until(kind, flags, stream_id, payload):
                    return seen
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                data = b""
            if not data:
                seen.append(("closed", 0, 0, b""))
                return seen
            self.buffer += data
        raise AssertionError(f"nothing ended the wait: {seen}")

    def status(self, frames, stream_id: int) -> dict:
        """The header fields the server sent on `stream_id` (the last header block's)."""
        fields = {}
        for kind, _, sid, payload in frames:
            if kind == HEADERS:
                block = dict(self.decoder.decode(payload))
                if sid == stream_id:
                    fields = block
        return fields


def _closed_or_goaway(kind, *_):
    return kind in (GOAWAY, "closed")


def test_bad_preface_is_refused_with_a_protocol_error(make_server):
    server = make_server()
    client = RawClient(server.port, preface=False)
    client.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    seen = client.frames(lambda kind, *_: kind == "closed")
    goaway = [payload for kind, _, _, payload in seen if kind == GOAWAY]
    assert goaway and struct.unpack(">LL", goaway[0][:8])[1] == 1  # PROTOCOL_ERROR
    assert b"preface" in goaway[0]


def test_header_body_and_idle_timeouts(make_server):
    server = make_server(HttpServerSettings(header_timeout_s=0.3, body_timeout_s=0.3, idle_timeout_s=0.6))
    silent = RawClient(server.port)  # a preface, then nothing
    assert any(kind == GOAWAY for kind, *_ in silent.frames(_closed_or_goaway))
    assert server.timeouts["header"] == 1

    slow = RawClient(server.port)
    slow.sock.sendall(slow.call_frames(1, b"abc", end=False))  # the request never ends
    seen = slow.frames(lambda kind, flags, sid, _: kind == RST_STREAM and sid == 1)
    assert slow.status(seen, 1)["grpc-status"] == str(Status.DEADLINE_EXCEEDED)
    assert server.timeouts["body"] == 1

    slow.sock.sendall(slow.call_frames(3, b"abc"))  # the connection still serves
    seen = slow.frames(lambda kind, flags, sid, _: kind == HEADERS and sid == 3 and flags & 1)
    assert slow.status(seen, 3)["grpc-status"] == "0"
    seen = slow.frames(_closed_or_goaway)  # then nothing: idle
    assert any(kind == GOAWAY for kind, *_ in seen) and server.timeouts["idle"] == 1


def test_connection_limit(make_server):
    server = make_server(HttpServerSettings(max_connections=2))
    kept = [RawClient(server.port) for _ in range(2)]
    for client in kept:
        client.sock.sendall(client.call_frames(1, b"ok"))
        client.frames(lambda kind, flags, sid, _: kind == HEADERS and flags & 1)
    extra = RawClient(server.port)
    assert extra.frames(lambda kind, *_: kind == "closed")[-1][0] == "closed"
    assert server.refused == 1
    kept[0].sock.close()
    time.sleep(0.2)
    again = RawClient(server.port)
    again.sock.sendall(again.call_frames(1, b"ok"))
    seen = again.frames(lambda kind, flags, sid, _: kind == HEADERS and flags & 1)
    assert again.status(seen, 1)["grpc-status"] == "0"


def test_streams_beyond_the_limit_are_refused_not_held(make_server):
    server = make_server()
    client = RawClient(server.port)
    n = MAX_CONCURRENT_STREAMS + 3
    client.sock.sendall(b"".join(client.call_frames(2 * i + 1, b"x", end=False)[:-15] for i in range(n)))
    seen = client.frames(lambda kind, flags, sid, _: kind == RST_STREAM and sid == 2 * n - 1)
    refused = [sid for kind, _, sid, payload in seen if kind == RST_STREAM and payload == struct.pack(">L", 7)]
    assert refused == [2 * i + 1 for i in range(MAX_CONCURRENT_STREAMS, n)]


def test_a_compression_bomb_is_refused(make_server):
    server = make_server(max_message_bytes=1 << 20)
    client = RawClient(server.port)
    bomb = gzip.compress(b"\0" * (64 << 20))
    assert len(bomb) < 1 << 20
    client.sock.sendall(client.call_frames(1, bomb, headers=[("grpc-encoding", "gzip")], compressed=True))
    seen = client.frames(lambda kind, flags, sid, _: kind == HEADERS and flags & 1)
    assert client.status(seen, 1)["grpc-status"] == str(Status.RESOURCE_EXHAUSTED)


def test_data_beyond_the_windows_is_a_flow_control_error(make_server):
    """The server gives window back only while its streams hold at most one message's limit: a
    client that sends more than it was given is cut off, so no more is ever held."""
    server = make_server(HttpServerSettings(body_timeout_s=5), max_message_bytes=1 << 20)
    client = RawClient(server.port)
    chunk = b"z" * 16000
    client.sock.settimeout(2)
    try:
        for i in range(8):  # streams that never end, 1 MB each: 8 MB against a 4 MiB window
            client.sock.sendall(client.call_frames(2 * i + 1, b"", end=False)[:-14])
            for _ in range(64):
                client.sock.sendall(frame(DATA, 0, 2 * i + 1, chunk))
    except OSError:
        pass  # closed under us
    seen = client.frames(_closed_or_goaway)
    goaway = [p for kind, _, _, p in seen if kind == GOAWAY]
    assert goaway and struct.unpack(">LL", goaway[0][:8])[1] == 3  # FLOW_CONTROL_ERROR
    assert b"window" in goaway[0]


def test_a_protocol_error_closes_only_that_connection(make_server):
    server = make_server()
    good = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    assert _call(good, ECHO, b"ab") == b"ba"
    bad = RawClient(server.port)
    bad.sock.sendall(frame(DATA, 0, 0, b"x") + frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\1"))  # DATA on stream 0
    seen = bad.frames(_closed_or_goaway)
    assert any(kind == GOAWAY and struct.unpack(">LL", p[:8])[1] == 1 for kind, _, _, p in seen)
    assert _call(good, ECHO, b"cd") == b"dc"
    good.close()


def test_a_port_in_use_is_an_error_naming_it():
    from otel_llm.collector.receiver.otlp_grpc import OtlpGrpcReceiver, OtlpGrpcReceiverConfig

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot bind OTLP/gRPC to 127.0.0.1:{port}"):
            OtlpGrpcReceiver(lambda *a: None, OtlpGrpcReceiverConfig(port=port)).start()


def test_a_client_that_does_not_read_its_answers_is_closed(make_server):
    """It opens its windows wide and sends calls without reading: once the answers fill the socket,
    the server stops reading its calls, and closes it after the write timeout."""
    server = make_server(HttpServerSettings(write_timeout_s=0.5))
    client = RawClient(server.port)
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.sock.sendall(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", 2**31 - 1 - 65535)))
    message = b"q" * 16000
    client.sock.settimeout(3)
    sent = 0
    try:
        for i in range(2000):  # 32 MB of answers, far beyond what the kernel buffers hold
            client.sock.sendall(client.call_frames(2 * i + 1, message))
            sent += 1
    except OSError:
        pass  # the server stopped reading (sendall timed out), or closed the connection
    deadline = time.monotonic() + 10
    while server.timeouts["write"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.timeouts["write"] == 1 and sent < 2000
