"""A small HTTP server in its own thread: what the collector's scrape endpoint and Jaeger query
API are served by.

Threads: one accepting thread, one daemon thread per connection (the handler's methods run
there and must only touch thread-safe state).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HttpEndpoint:
    """Serves ``handler`` on ``host:port`` (0 = any free port) from `start` until `stop`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str, port: int, name: str) -> None:
        self.host, self.requested_port, self._handler, self._name = host, port, handler, name
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"{self._name} is not started")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Binds now (OSError when the port is taken), then serves in a daemon thread."""
        self._server = ThreadingHTTPServer((self.host, self.requested_port), self._handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = self._thread = None
