"""One connection to a collector listener: its phases and their deadlines, TLS and credentials,
and `EndpointHandler`, the base of every listener's request handler (see `http_endpoint`).

A request's header block is read by `read_headers`, not by `http.server`'s `email` parser, which
cost a fifth of the CPU of an OTLP/HTTP export (a 30 KB, 66-point one; `collector_bench`): the same
`HTTPMessage`, names and values as that parser gives them, and the same limits (a line of 64 KiB,
100 lines). A block it does not read as plain ``Name: value`` lines (folded ones, say) and any
request line but ``METHOD target HTTP/1.x`` go to the standard library's parser.

Threads: a `Connection` and its handler live on the connection's own thread; `HttpEndpoint`
reads `phase` and `idle_since` (under its lock) to choose an idle connection to close.
"""

from __future__ import annotations

import email.parser
import email.utils
import enum
import functools
import io
import logging
import ssl
import time
from http import HTTPStatus
from http.client import HTTPException, HTTPMessage, LineTooLong
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket

    from otel_llm.collector.http_endpoint import HttpEndpoint

logger = logging.getLogger(__name__)

_UNAUTHORIZED_BODY_BYTES = 4 * 1024 * 1024  # read and dropped before a 401; a larger body is not
_MAX_LINE, _MAX_HEADERS = 65536, 100  # http.client's limits
_ONE_WRITE_BYTES = 64 * 1024  # an answer up to this size is sent with its headers in one write


class Phase(enum.Enum):
    HEADER = "header"
    BODY = "body"
    IDLE = "idle"
    DONE = "done"  # the body is read: the handler works and answers


_TIMEOUT_REASONS = {Phase.HEADER: "header_timeouts", Phase.BODY: "body_timeouts", Phase.IDLE: "idle_closed"}


class Connection(io.RawIOBase):
    """A connection's raw reader: each read waits at most until its phase's deadline."""

    def __init__(self, sock: socket.socket, endpoint: HttpEndpoint) -> None:
        self.sock, self.endpoint, self.timeouts = sock, endpoint, endpoint.timeouts
        self.phase, self.deadline = Phase.HEADER, time.monotonic() + endpoint.settings.header_timeout_s
        self.idle_since, self.timeout = 0.0, 0.0
        self._set_timeout(endpoint.settings.header_timeout_s)

    def readable(self) -> bool:
        return True

    def begin(self, phase: Phase) -> None:
        now = time.monotonic()
        if phase is Phase.IDLE or self.phase is Phase.IDLE:  # what `HttpEndpoint.admit` reads, under its lock
            with self.endpoint.lock:
                self.phase, self.deadline, self.idle_since = phase, now + self.timeouts[phase], now
        else:
            self.phase, self.deadline = phase, now + self.timeouts[phase]
        if phase is Phase.DONE and self.timeout != self.timeouts[phase]:
            self._set_timeout(self.timeouts[phase])  # each write of the answer

    def _set_timeout(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        self.timeout = timeout

    def readinto(self, buffer: Any) -> int:
        """A read waits until the phase's deadline at most (~10% past it: the socket's timeout is
        shortened only when it is that much longer than what is left; a shorter one is waited out
        again until the deadline)."""
        while True:
            remaining = self.deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                if remaining < 0.9 * self.timeout:
                    self._set_timeout(remaining)
                n = self.sock.recv_into(buffer)
                break
            except TimeoutError:
                if self.deadline - time.monotonic() > 0:
                    continue  # the socket's timeout was shorter than the phase's
                if self.phase in _TIMEOUT_REASONS:
                    self.endpoint.count(_TIMEOUT_REASONS[self.phase])
                raise TimeoutError(f"{self.phase.value} deadline passed") from None
        if n and self.phase is Phase.IDLE:
            self.begin(Phase.HEADER)
        return n


class EndpointHandler(BaseHTTPRequestHandler):
    """Base of the listeners' handlers: deadlines per phase, and `send` for every answer."""

    protocol_version = "HTTP/1.1"
    server_version = "otel-llm-collector"
    endpoint: HttpEndpoint  # set on the subclass HttpEndpoint serves

    def setup(self) -> None:
        self.reader = None
        context = self.endpoint.ssl_context
        if context is not None:
            self.request.settimeout(self.endpoint.settings.header_timeout_s)
            try:
                self.request = context.wrap_socket(self.request, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                logger.debug("%s: TLS handshake with %s failed: %s", self.endpoint.name, self.client_address, exc)
                self.endpoint.count("tls_handshake_failed")
                return
        super().setup()
        self.rfile.close()  # the socket's own reader, replaced by one that keeps the deadlines
        self.reader = Connection(self.connection, self.endpoint)
        self.rfile = io.BufferedReader(self.reader, 64 * 1024)
        self.endpoint.opened(self.reader)
        self._served = 0

    def handle(self) -> None:
        if self.reader is not None:
            super().handle()

    def finish(self) -> None:
        if self.reader is None:
            return
        self.endpoint.closed(self.reader)
        try:
            super().finish()
        finally:
            if self.endpoint.ssl_context is not None:
                self.connection.close()  # the server closes the socket it accepted, not this wrapper

    def handle_one_request(self) -> None:
        if self._served:
            self.reader.begin(Phase.IDLE)
        self._served += 1
        super().handle_one_request()

    def parse_request(self) -> bool:
        if not self._parse_request():
            return False
        self.reader.begin(Phase.BODY)
        auth = self.endpoint.settings.auth
        if auth is not None and not auth.check(self.headers.get("Authorization")):
            self.endpoint.count("unauthorized")
            self.close_connection = True
            self.discard(_UNAUTHORIZED_BODY_BYTES)
            self.deny(401, "missing or wrong credentials", (("WWW-Authenticate", f'{auth.scheme} realm="otel-llm"'),))
            return False
        return True

    def _parse_request(self) -> bool:
        """`BaseHTTPRequestHandler.parse_request` for a plain HTTP/1.x request line, its header block
        read by `read_headers`; anything else is the standard library's to parse."""
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        version = words[2] if len(words) == 3 else ""
        if not (version[:7] == "HTTP/1." and version[7:].isascii() and version[7:].isdigit() and len(version) <= 17):
            return super().parse_request()
        command, path, version = words
        self.command, self.request_version = command, version
        self.path = "/" + path.lstrip("/") if path.startswith("//") else path  # as http.server (gh-87389)
        self.close_connection = int(version[7:]) < 1
        try:
            self.headers = read_headers(self.rfile)
        except LineTooLong as exc:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long", str(exc))
            return False
        except HTTPException as exc:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers", str(exc))
            return False
        connection = self.headers.get("Connection", "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        if self.headers.get("Expect", "").lower() == "100-continue" and version >= "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def deny(self, status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Answers a request refused before its handler ran (a handler overrides it for its format)."""
        self.send(status, "text/plain; charset=utf-8", f"{reason}\n".encode(), headers)

    def discard(self, limit: int) -> None:
        """Reads and drops a body of at most `limit` bytes, so the client reads the answer rather
        than a reset; a larger or chunked one is left, and the connection closed."""
        length = self.headers.get("Content-Length", "0").strip()
        if not length.isdigit() or int(length) > limit or "chunked" in self.headers.get("Transfer-Encoding", ""):
            self.close_connection = True
            return
        left = int(length)
        try:
            while left > 0:
                chunk = self.rfile.read(min(left, 64 * 1024))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass
        if left:
            self.close_connection = True

    def body_read(self) -> None:
        """The handler read what it will of the body: the answer's writes get `write_timeout_s`."""
        self.reader.begin(Phase.DONE)

    def send(self, status: int, content_type: str, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> None:
        if self.reader.phase is not Phase.DONE:
            self.body_read()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        if len(body) <= _ONE_WRITE_BYTES and self.request_version != "HTTP/0.9":
            self._headers_buffer.extend((b"\r\n", body))  # end_headers, and the body in the same write
            self.flush_headers()
            return
        self.end_headers()
        self.wfile.write(body)

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header's text, formatted once a second rather than per answer."""
        return _http_date(int(time.time()) if timestamp is None else timestamp)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s " + format, self.endpoint.name, self.address_string(), *args)


def read_headers(rfile: Any) -> HTTPMessage:
    """A request's header block, up to its empty line, as `http.client.parse_headers` reads it (the
    same limits, counted as it counts them): each ``Name: value`` line (a name of printable ASCII
    but space) set raw, the value without leading blanks and the line's end; a block with any other
    line (folded, or without a name) parsed by `email` as there."""
    lines: list[bytes] = []
    while True:
        line = rfile.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise LineTooLong("header line")
        lines.append(line)
        if len(lines) > _MAX_HEADERS:
            raise HTTPException(f"got more than {_MAX_HEADERS} headers")
        if line in (b"\r\n", b"\n", b""):
            break
    message = HTTPMessage()
    for line in lines[:-1]:
        name, colon, value = line.decode("iso-8859-1").partition(":")
        if not (colon and name.isascii() and name.isprintable() and name and " " not in name):
            return email.parser.Parser(_class=HTTPMessage).parsestr(b"".join(lines).decode("iso-8859-1"))
        message.set_raw(name, value.lstrip(" \t").rstrip("\r\n"))
    return message


@functools.lru_cache(maxsize=1)
def _http_date(timestamp: float) -> str:
    return email.utils.formatdate(timestamp, usegmt=True)  # what BaseHTTPRequestHandler writes
