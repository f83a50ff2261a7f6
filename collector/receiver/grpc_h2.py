"""A small gRPC server for unary calls: HTTP/2 (cleartext, or TLS with ALPN ``h2``) on asyncio.

Why not grpcio's server: it costs 290-440 µs of CPU per call before the handler runs (its
completion-queue thread hands every call to a pool thread), more than the OTLP receiver's own
work on a server's export; this server does the same calls in a fraction of that
(`benchmarks/grpc_server_bench.py`). It speaks what gRPC clients send to a unary method and no
more: one request message per stream, ``identity``, ``gzip`` or ``deflate`` message encoding,
the answer in one write (headers, message, trailers), or trailers only for an error.

One event loop thread serves every connection; handlers run on it (the receiver's sink is CPU
work: a thread hand-off per call would cost more than it saves). Bounds, from the listener's
`HttpServerSettings` (the collector's connection flags; its `tls` and `auth` too): connections
(beyond `max_connections`, closed at once), the preface and first request within `header_timeout_s`,
each request's message within `body_timeout_s` (else the stream is reset), connections with no
call for `idle_timeout_s` closed with GOAWAY, a client that does not read its answers for
`write_timeout_s` closed; per connection at most
`MAX_CONCURRENT_STREAMS` calls and `max_message_bytes` of request bytes held (flow control stops
the client beyond that).

Size: one protocol, HTTP/2's frames as far as unary gRPC needs them, with its bounds.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
import zlib
from collections.abc import Callable, Mapping

import hpack

from otel_llm.collector.http_endpoint import HttpServerSettings

logger = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_CONCURRENT_STREAMS = 64
_STREAM_WINDOW = 1 << 20  # SETTINGS_INITIAL_WINDOW_SIZE we announce
_CONNECTION_WINDOW = 4 << 20
_DEFAULT_WINDOW = 65535
MAX_FRAME = 1 << 20  # SETTINGS_MAX_FRAME_SIZE we announce: a server's export in one DATA frame
_MAX_SEND_FRAME = 16384  # the protocol's default, what every peer accepts
_MAX_HEADER_LIST = 64 * 1024
_GRACE_S = 2.0  # after a GOAWAY without error, until the connection is closed

# Frame types and flags (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# Error codes (RFC 9113 §7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 6, 7, 8, 9, 11

_HEADER = struct.Struct(">BHBBL")  # length (24 bits: 8 + 16), type, flags, stream id


class Status:
    """gRPC status codes the server answers with."""

    OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
    RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, UNAUTHENTICATED = 8, 12, 13, 14, 16


class GrpcError(Exception):
    """Raised by a handler: the call is answered with this status and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


Handler = Callable[[bytes], bytes]  # request message -> response message; raises GrpcError


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEADER.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out, value = bytearray((first | limit,)), value - limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing (HPACK §6.2.2: not added to the decoder's table), no Huffman."""
    return b"\x00" + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value


# ":status: 200" (static index 8) and content-type (static name 31) as a literal without indexing.
_RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + _hpack_int(16, 7, 0) + b"application/grpc"
_TRAILERS_OK = _literal(b"grpc-status", b"0")


def _percent_encoded(message: str) -> bytes:
    """grpc-message's encoding: bytes outside 0x20-0x7E and '%' as %XX."""
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
                    for b in message.encode("utf-8"))


def _status_fields(code: int, message: str) -> bytes:
    fields = _literal(b"grpc-status", str(code).encode())
    return fields + _literal(b"grpc-message", _percent_encoded(message[:1024])) if message else fields


# A header block of only these bytes is fields indexed in one byte (HPACK §6.1): its decoding reads the
# decoder's table and does not change it, so it means the same until a block of other bytes comes.
_ONE_BYTE_INDEXED = bytes(range(0x81, 0xFF))


class _Head:
    """What a call's header block says that the server reads."""

    __slots__ = ("path", "method", "content_type", "authorization", "encoding")

    def __init__(self, headers) -> None:
        self.path = self.method = self.content_type = self.authorization = self.encoding = None
        for name, value in headers:
            if name == ":path":
                self.path = value
            elif name == ":method":
                self.method = value
            elif name == "content-type":
                self.content_type = value
            elif name == "authorization":
                self.authorization = value
            elif name == "grpc-encoding":
                self.encoding = value


class _Stream:
    __slots__ = ("head", "body", "unacked", "deadline")

    def __init__(self, head: _Head, deadline: float) -> None:
        self.head = head
        self.body = bytearray()
        self.unacked = 0  # received bytes not yet given back as stream window
        self.deadline = deadline


class _ConnectionError(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class _Connection(asyncio.Protocol):
    def __init__(self, server: UnaryServer) -> None:
        self.server, self.settings = server, server.settings
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.preface = False
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = _MAX_HEADER_LIST
        self.heads: dict[bytes, _Head] = {}  # header blocks of one-byte indexed fields, decoded
        self.streams: dict[int, _Stream] = {}
        self.last_stream = 0
        self.continuation: tuple[int, int, bytearray] | None = None
        self.held = 0  # request bytes buffered in open streams
        self.conn_unacked = 0  # received bytes not yet given back as connection window
        self.send_window = _DEFAULT_WINDOW  # the client's connection window for our DATA
        self.stream_send_window = _DEFAULT_WINDOW  # its SETTINGS_INITIAL_WINDOW_SIZE
        self.pending: list[tuple[int, bytes]] = []  # answers waiting for connection window: (DATA bytes, frames)
        self.out: list[bytes] = []
        now = time.monotonic()
        self.deadline = now + self.settings.header_timeout_s  # the preface and the first request
        self.idle_since = now
        self.paused_since = 0.0  # the transport's buffer is full: the client does not read
        self.closing = False  # our GOAWAY was sent: no new calls

    # -- asyncio callbacks ------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        if len(self.server.connections) >= self.settings.max_connections:
            self.server.refused += 1
            transport.abort()
            return
        self.server.connections.add(self)
        settings = struct.pack(">HLHLHLHLHL", 0x3, MAX_CONCURRENT_STREAMS, 0x4, _STREAM_WINDOW,
                               0x5, MAX_FRAME, 0x6, _MAX_HEADER_LIST, 0x2, 0)  # SETTINGS_ENABLE_PUSH 0
        transport.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", _CONNECTION_WINDOW - _DEFAULT_WINDOW)))

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        self.streams.clear()

    def pause_writing(self) -> None:
        self.paused_since = time.monotonic()
        self.transport.pause_reading()  # no new calls while answers pile up

    def resume_writing(self) -> None:
        self.paused_since = 0.0
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.buffer:
            self.buffer += data
            data = self.buffer
        try:
            if not self.preface:
                data = self._preface(data)
            self.buffer = bytearray(self._frames(data)) if data else bytearray()
        except _ConnectionError as exc:
            self._go_away(exc.code, str(exc))
        except hpack.HPACKError as exc:
            self._go_away(COMPRESSION_ERROR, f"bad header block: {exc}")
        except Exception:  # a bug here must cost one connection, never the server
            logger.exception("gRPC connection failed")
            self._go_away(INTERNAL_ERROR, "internal error")
        self._flush()

    def _flush(self) -> None:
        """Writes what the handling of the last frames answered, in one write."""
        if self.out:
            self.transport.write(b"".join(self.out))
            self.out.clear()

    def _preface(self, data) -> bytes:
        """-> what follows the client's connection preface (b"" until all of it came)."""
        n = len(PREFACE)
        if data[:n] != PREFACE[:len(data)]:
            raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        if len(data) < n:
            self.buffer = bytearray(data)
            return b""
        self.preface = True
        return data[n:]

    # -- frames -----------------------------------------------------------------------------

    def _frames(self, data) -> memoryview:
        """Handles the whole frames in `data`; -> the rest (a frame's beginning). Payloads are views
        of `data`: no copy."""
        view, pos, end = memoryview(data), 0, len(data)
        while end - pos >= 9 and not self.transport.is_closing():
            high, low, kind, flags, stream_id = _HEADER.unpack_from(data, pos)
            length = high << 16 | low
            if length > MAX_FRAME:
                raise _ConnectionError(FRAME_SIZE_ERROR, f"frame of {length} bytes over {MAX_FRAME}")
            if end - pos - 9 < length:
                break
            payload = view[pos + 9:pos + 9 + length]
            pos += 9 + length
            stream_id &= 0x7FFFFFFF
            if self.continuation is not None and kind != CONTINUATION:
                raise _ConnectionError(PROTOCOL_ERROR, "header block interrupted before END_HEADERS")
            if kind == DATA:
                self._data(flags, stream_id, payload, length)
            elif kind == HEADERS:
                self._headers(flags, stream_id, payload)
            elif kind == CONTINUATION:
                self._continuation(flags, stream_id, payload)
            elif kind == SETTINGS:
                self._settings(flags, stream_id, payload)
            elif kind == WINDOW_UPDATE:
                self._window_update(stream_id, payload)
            elif kind == PING:
                if len(payload) != 8 or stream_id:
                    raise _ConnectionError(FRAME_SIZE_ERROR if stream_id == 0 else PROTOCOL_ERROR, "bad PING")
                if not flags & ACK:
                    self.out.append(frame(PING, ACK, 0, bytes(payload)))
            elif kind == RST_STREAM:
                stream = self.streams.pop(stream_id, None)
                if stream is not None:
                    self._release(stream)
            # GOAWAY: the client opens no more streams and closes the connection itself
            elif kind == PUSH_PROMISE:
                raise _ConnectionError(PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
            # PRIORITY and unknown types are ignored (RFC 9113 §5.5)
        return view[pos:]

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, i)
            if key == 0x4:  # INITIAL_WINDOW_SIZE
                if value > 0x7FFFFFFF:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "initial window over 2^31-1")
                self.stream_send_window = value
        self.out.append(frame(SETTINGS, ACK, 0))

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes")
        if stream_id == 0:
            self.send_window += struct.unpack(">L", payload)[0] & 0x7FFFFFFF
            while self.pending and self.pending[0][0] <= self.send_window:
                size, frames = self.pending.pop(0)
                self.send_window -= size
                self.out.append(frames)

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise _ConnectionError(PROTOCOL_ERROR, "padding as long as the frame")
            return payload[1:len(payload) - payload[0]]
        return payload

    def _headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            block = block[5:]
        block = bytes(block)
        if flags & END_HEADERS:
            self._header_block(flags, stream_id, block)
        else:
            self.continuation = (stream_id, flags, bytearray(block))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuation is None or self.continuation[0] != stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block = self.continuation[2]
        block += payload
        if len(block) > _MAX_HEADER_LIST:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            first_flags = self.continuation[1]
            self.continuation = None
            self._header_block(first_flags, stream_id, bytes(block))

    def _header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        head = self.heads.get(block)
        if head is None:
            head = _Head(self.decoder.decode(block))  # always decoded: its table follows every block
            if block.translate(None, _ONE_BYTE_INDEXED):
                self.heads.clear()  # it may have changed the decoder's table: what the cached blocks meant
            elif len(self.heads) < 64:
                self.heads[block] = head
        if stream_id in self.streams:  # trailers of a request: unary requests end here
            if not flags & END_STREAM:
                raise _ConnectionError(PROTOCOL_ERROR, "second header block without END_STREAM")
            self._end(stream_id, self.streams[stream_id])
            return
        if stream_id % 2 == 0 or stream_id <= self.last_stream:
            raise _ConnectionError(PROTOCOL_ERROR, f"stream {stream_id} not a new client stream")
        self.last_stream = stream_id
        if self.closing:
            return  # past our GOAWAY's last stream: the client retries it on a new connection
        if len(self.streams) + len(self.pending) >= MAX_CONCURRENT_STREAMS:  # answers waiting count too
            self.out.append(frame(RST_STREAM, 0, stream_id, struct.pack(">L", REFUSED_STREAM)))
            return
        now = time.monotonic()
        stream = _Stream(head, now + self.settings.body_timeout_s)
        self.deadline = 0.0  # past the first request: the idle timeout applies
        self.streams[stream_id] = stream
        error = None
        if head.method != "POST" or not (head.content_type or "").startswith("application/grpc"):
            error = (Status.INTERNAL, f"not a gRPC request: {head.method} with content-type {head.content_type}")
        elif head.path not in self.server.handlers:
            error = (Status.UNIMPLEMENTED, f"unknown method {head.path}")
        elif self.settings.auth is not None and not self.settings.auth.check(head.authorization):
            self.server.unauthorized += 1
            error = (Status.UNAUTHENTICATED, "missing or wrong credentials")
        elif head.encoding not in (None, "identity", "gzip", "deflate"):
            error = (Status.UNIMPLEMENTED, f"message encoding {head.encoding!r} not supported")
        if error is not None:
            self._answer(stream_id, stream, error[0], error[1], flags & END_STREAM)
        elif flags & END_STREAM:
            self._end(stream_id, stream)

    def _data(self, flags: int, stream_id: int, payload: memoryview, length: int) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        self.conn_unacked += length
        if self.conn_unacked > _CONNECTION_WINDOW:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        stream = self.streams.get(stream_id)
        if stream is None:
            self._credit()
            return  # a stream answered or reset: dropped
        stream.unacked += length
        if stream.unacked > _STREAM_WINDOW:
            raise _ConnectionError(FLOW_CONTROL_ERROR, f"DATA beyond stream {stream_id}'s window")
        data = self._unpad(flags, payload)
        if len(stream.body) + len(data) > self.server.max_message_bytes + 5:
            self._answer(stream_id, stream, Status.RESOURCE_EXHAUSTED,
                         f"request message over the limit of {self.server.max_message_bytes} bytes",
                         flags & END_STREAM)
        else:
            stream.body += data
            self.held += len(data)
            if flags & END_STREAM:
                self._end(stream_id, stream)
            elif stream.unacked >= _STREAM_WINDOW // 2:
                self.out.append(frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">L", stream.unacked)))
                stream.unacked = 0
        self._credit()

    def _credit(self) -> None:
        """Gives received bytes back as connection window, unless the streams hold more than one
        message's limit (then the client waits until calls are answered)."""
        if self.conn_unacked >= _CONNECTION_WINDOW // 2 and self.held <= self.server.max_message_bytes:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", self.conn_unacked)))
            self.conn_unacked = 0

    def _release(self, stream: _Stream) -> None:
        self.held -= len(stream.body)
        stream.body = bytearray()
        self.idle_since = time.monotonic()
        self._credit()

    # -- calls ------------------------------------------------------------------------------

    def _end(self, stream_id: int, stream: _Stream) -> None:
        """The request is complete: decode its message, call the handler, answer."""
        del self.streams[stream_id]
        body = stream.body
        self._release(stream)
        if len(body) < 5 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            self._trailers_only(stream_id, Status.INTERNAL, "the request is not one length-prefixed gRPC message")
            return
        message = bytes(memoryview(body)[5:])
        if body[0]:
            if stream.head.encoding in (None, "identity"):
                self._trailers_only(stream_id, Status.INTERNAL, "compressed message without grpc-encoding")
                return
            limit = self.server.max_message_bytes
            inflate = zlib.decompressobj(zlib.MAX_WBITS | 16 if stream.head.encoding == "gzip" else zlib.MAX_WBITS)
            try:
                message = inflate.decompress(message, limit + 1)
            except zlib.error as exc:
                self._trailers_only(stream_id, Status.INTERNAL, f"cannot decompress the message: {exc}")
                return
            if len(message) > limit:
                self._trailers_only(stream_id, Status.RESOURCE_EXHAUSTED,
                                    f"decompressed request message over the limit of {limit} bytes")
                return
        try:
            reply = self.server.handlers[stream.head.path](message)
        except GrpcError as exc:
            self._trailers_only(stream_id, exc.code, exc.message)
            return
        except Exception:
            logger.exception("gRPC handler for %s failed", stream.head.path)
            self._trailers_only(stream_id, Status.INTERNAL, "internal error in the handler")
            return
        size = len(reply) + 5
        if size > min(self.stream_send_window, _MAX_SEND_FRAME):
            self._trailers_only(stream_id, Status.INTERNAL, f"the answer ({size} bytes) does not fit one frame")
            return
        frames = (frame(HEADERS, END_HEADERS, stream_id, _RESPONSE_HEADERS)
                  + frame(DATA, 0, stream_id, b"\x00" + len(reply).to_bytes(4, "big") + reply)
                  + frame(HEADERS, END_HEADERS | END_STREAM, stream_id, _TRAILERS_OK))
        if size <= self.send_window and not self.pending:
            self.send_window -= size
            self.out.append(frames)
        else:
            self.pending.append((size, frames))

    def _answer(self, stream_id: int, stream: _Stream, code: int, message: str, ended: int) -> None:
        """An error before the call's handler ran: trailers only; the stream is closed (and, unless the
        client's half was, reset so that the client stops sending: what it still sends is dropped)."""
        self._trailers_only(stream_id, code, message)
        del self.streams[stream_id]
        self._release(stream)
        if not ended:
            self.out.append(frame(RST_STREAM, 0, stream_id, struct.pack(">L", NO_ERROR)))

    def _trailers_only(self, stream_id: int, code: int, message: str) -> None:
        self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream_id,
                              _RESPONSE_HEADERS + _status_fields(code, message)))

    # -- closing ----------------------------------------------------------------------------

    def _go_away(self, code: int, reason: str, grace_s: float = 0.0) -> None:
        """GOAWAY, then close: after `grace_s`, so that calls the client sent before it read the
        GOAWAY are answered, or known unprocessed (and retried elsewhere)."""
        self.closing = True
        self.out.append(frame(GOAWAY, 0, 0, struct.pack(">LL", self.last_stream, code) + reason.encode()[:256]))
        self._flush()
        if grace_s:
            asyncio.get_running_loop().call_later(grace_s, self.transport.close)
        else:
            self.transport.close()

    def sweep(self, now: float) -> None:
        """Deadlines: the preface and first request, each request's message, idle, a client not reading."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.paused_since and now - self.paused_since > self.settings.write_timeout_s:
            self.server.timeouts["write"] += 1
            self.transport.abort()
        elif self.closing:
            return
        elif self.deadline and now > self.deadline:
            self.server.timeouts["header"] += 1
            self._go_away(NO_ERROR, "no request within the header timeout", _GRACE_S)
        elif not self.streams and now - self.idle_since > self.settings.idle_timeout_s:
            self.server.timeouts["idle"] += 1
            self._go_away(NO_ERROR, "idle", _GRACE_S)
        else:
            for stream_id, stream in list(self.streams.items()):
                if now > stream.deadline:
                    self.server.timeouts["body"] += 1
                    self._answer(stream_id, stream, Status.DEADLINE_EXCEEDED,
                                 "the request message did not arrive within the body timeout", 0)
            self._flush()


class UnaryServer:
    """Serves `handlers` (``"/package.Service/Method"`` -> handler) on ``host:port`` until stopped."""

    def __init__(self, handlers: Mapping[str, Handler], host: str = "127.0.0.1", port: int = 0, *,
                 settings: HttpServerSettings | None = None, max_message_bytes: int = 16 * 1024 * 1024,
                 name: str = "grpc") -> None:
        self.handlers = dict(handlers)
        self.host, self.requested_port = host, port
        self.settings = settings = settings or HttpServerSettings()
        self.max_message_bytes = max_message_bytes
        self.ssl_context = None if settings.tls is None else settings.tls.server_context()
        if self.ssl_context is not None:
            self.ssl_context.set_alpn_protocols(["h2"])
        self.name = name
        self.connections: set[_Connection] = set()
        self.refused = self.unauthorized = 0
        self.timeouts = {"header": 0, "body": 0, "idle": 0, "write": 0}
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    def start(self) -> int:
        """Binds and serves on a thread of its own; returns the bound port. Raises OSError."""
        started = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._stopped = asyncio.Event()
            try:
                server = await asyncio.get_running_loop().create_server(
                    lambda: _Connection(self), self.host, self.requested_port, ssl=self.ssl_context,
                    backlog=self.settings.backlog, reuse_address=True)
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            sweeper = asyncio.create_task(self._sweep())
            await self._stopped.wait()
            sweeper.cancel()
            server.close()
            for connection in list(self.connections):
                connection._go_away(NO_ERROR, "server stopping")

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(serve(),),
                                        name=f"{self.name}-server", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        return self.port

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.header_timeout_s / 4))
            now = time.monotonic()
            for connection in list(self.connections):
                connection.sweep(now)

    def stop(self) -> None:
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(5)
        self._loop.close()
        self._thread = None
