"""The server behind every HTTP listener of the collector: OTLP/HTTP, Prometheus ``/metrics``,
Jaeger's query API and ``/ui``.

The standard library's `http.server` (one thread per connection), bounded at its edges:

- a listen backlog of `backlog` (4096; the kernel caps it at ``net.core.somaxconn``), so a fleet
  connecting at once is queued, not dropped (the standard library's is 5);
- at most `max_connections` connections at once. One beyond that first closes the longest-idle
  keep-alive connection (a client reconnects on its next export) and takes its place; when none
  is idle it is answered ``503`` with ``Retry-After: 1`` at once, and its request is read and
  discarded by one lingering thread, so the client reads the answer rather than a reset;
- deadlines, not per-read timeouts (a client sending one byte a second would reset those):
  the request line and headers within `header_timeout_s` of the connection (or of a keep-alive
  request's first byte), the body within `body_timeout_s` of the headers, a keep-alive connection
  closed after `idle_timeout_s` without a request, each write of the answer within
  `write_timeout_s`. A client past a deadline is disconnected without an answer, counted by phase.

Why not uvicorn (which the reference server uses): it has neither header nor body read
deadlines, so they would be written again there; each listener's work (decoding OTLP, rendering
``/metrics``, SQLite queries) is CPU- or disk-bound and would leave the event loop for a thread
anyway; and a request's framing here, its headers read without `email`'s parser
(`http_connection.read_headers`), costs a small part of its decoding (`collector_bench`).

Threads: one accepting thread, one per connection (handlers' methods run there and must touch
only thread-safe state), one for refused connections (`RefusedConnections`).
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any, NamedTuple

from otel_llm.cli.tls import TlsConfig
from otel_llm.collector.extension.auth import Authenticator
from otel_llm.collector.http_connection import Connection, EndpointHandler, Phase
from otel_llm.collector.refused_connections import RefusedConnections

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class HttpServerSettings:
    """Connection limits of one listener (the OpenTelemetry Collector's confighttp words)."""

    max_connections: int = 256  # served at once, each by a thread; idle keep-alive ones make room
    backlog: int = 4096
    header_timeout_s: float = 10.0  # request line + headers
    body_timeout_s: float = 30.0  # the whole body, from the end of the headers
    idle_timeout_s: float = 60.0  # a keep-alive connection waiting for its next request
    write_timeout_s: float = 30.0  # each write of an answer to a client that reads slowly
    tls: TlsConfig | None = None  # None: plain HTTP
    auth: Authenticator | None = None  # None: no credentials asked

    def __post_init__(self) -> None:
        for name in ("max_connections", "backlog"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s", "write_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


class EndpointStats(NamedTuple):
    """Connections the listener closed before or instead of serving them, by reason."""

    refused: int = 0  # beyond max_connections, none idle: answered 503 (closed at once under TLS)
    idle_closed: int = 0  # keep-alive connections closed to make room, or after idle_timeout_s
    header_timeouts: int = 0
    body_timeouts: int = 0
    tls_handshake_failed: int = 0
    unauthorized: int = 0  # answered 401

    def as_reasons(self) -> tuple[tuple[str, int], ...]:
        return tuple(zip(("refused", "idle_closed", "header_timeout", "body_timeout", "tls_handshake_failed",
                          "unauthorized"), self, strict=True))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: HttpEndpoint

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.endpoint.admit():
            self.endpoint.refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread to release the slot
            self.endpoint.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.endpoint.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanishes or times out mid-request is not our error.
        logger.debug("%s: connection from %s failed", self.endpoint.name, client_address, exc_info=True)


class HttpEndpoint:
    """Serves ``handler`` (an `EndpointHandler` subclass) on ``host:port`` (0 = any free port)
    from `start` until `stop`."""

    def __init__(self, handler: type[EndpointHandler], host: str, port: int, name: str,
                 settings: HttpServerSettings | None = None) -> None:
        self.host, self.requested_port, self.name = host, port, name
        self.settings = settings = settings or HttpServerSettings()
        self.ssl_context = None if settings.tls is None else settings.tls.server_context()
        self.timeouts = {Phase.HEADER: settings.header_timeout_s, Phase.BODY: settings.body_timeout_s,
                         Phase.IDLE: settings.idle_timeout_s, Phase.DONE: settings.write_timeout_s}
        self._handler = type(handler.__name__, (handler,), {"endpoint": self})
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(self.settings.max_connections)
        self._open: set[Connection] = set()
        self._counts = dict.fromkeys(EndpointStats._fields, 0)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._refused: RefusedConnections | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"{'http' if self.ssl_context is None else 'https'}://{self.host}:{self.port}"

    def start(self) -> None:
        """Binds now (OSError when the port is taken), then serves in a daemon thread."""
        if self._server is not None:
            raise RuntimeError(f"{self.name} already started")
        server_class = type("_Bound", (_Server,), {"endpoint": self, "request_queue_size": self.settings.backlog})
        self._server = server_class((self.host, self.requested_port), self._handler)
        self._refused = RefusedConnections()
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._refused.close()
        self._server = self._thread = self._refused = None

    def __enter__(self) -> HttpEndpoint:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stats(self) -> EndpointStats:
        with self.lock:
            return EndpointStats(**self._counts)

    # -- called by the server's threads --

    def admit(self) -> bool:
        """A slot for a new connection: a free one, or one an idle keep-alive connection gives up."""
        if self.slots.acquire(blocking=False):
            return True
        with self.lock:
            idle = [c for c in self._open if c.phase is Phase.IDLE]
            oldest = min(idle, key=lambda c: c.idle_since, default=None)
            if oldest is not None:
                oldest.phase = Phase.DONE  # no longer idle: not chosen twice
                self._counts["idle_closed"] += 1
        if oldest is None:
            return False
        try:
            oldest.sock.shutdown(socket.SHUT_RDWR)  # its thread reads the end of the stream and returns
        except OSError:
            pass
        return self.slots.acquire(timeout=1.0)

    def refuse(self, sock: socket.socket) -> None:
        self.count("refused")
        if self.ssl_context is None:
            self._refused.refuse(sock)
        else:  # no 503 before a handshake: closed, which clients retry as well
            sock.close()

    def count(self, reason: str) -> None:
        with self.lock:
            self._counts[reason] += 1

    def opened(self, connection: Connection) -> None:
        with self.lock:
            self._open.add(connection)

    def closed(self, connection: Connection) -> None:
        with self.lock:
            self._open.discard(connection)
