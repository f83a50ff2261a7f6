"""One connection to a collector listener: its phases and their deadlines, TLS and credentials,
and `EndpointHandler`, the base of every listener's request handler (see `http_endpoint`).

Threads: a `Connection` and its handler live on the connection's own thread; `HttpEndpoint`
reads `phase` and `idle_since` (under its lock) to choose an idle connection to close.
"""

from __future__ import annotations

import enum
import io
import logging
import ssl
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket

    from otel_llm.collector.http_endpoint import HttpEndpoint

logger = logging.getLogger(__name__)

_UNAUTHORIZED_BODY_BYTES = 4 * 1024 * 1024  # read and dropped before a 401; a larger body is not


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
        if not super().parse_request():
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
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s " + format, self.endpoint.name, self.address_string(), *args)
