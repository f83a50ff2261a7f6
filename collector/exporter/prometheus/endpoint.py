"""The Prometheus scrape endpoint: ``GET /metrics`` (text 0.0.4, or OpenMetrics 1.0 when
the ``Accept`` header asks for it, as Prometheus does, and the endpoint may serve it),
``GET /`` a pointer to it.

Threads: `HttpEndpoint`'s (a thread per connection, with its limits and deadlines); `render`
is called on those threads and must be thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from otel_llm.collector.http_connection import EndpointHandler
from otel_llm.collector.http_endpoint import HttpEndpoint, HttpServerSettings
from otel_llm.export.exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT, negotiate

logger = logging.getLogger(__name__)


class ScrapeEndpoint(HttpEndpoint):
    """Serves ``render(openmetrics: bool) -> bytes`` on ``host:port`` until stopped; `openmetrics`
    False: text 0.0.4 whatever the client asks (a profile of a text-only server)."""

    def __init__(self, render: Callable[[bool], bytes], host: str = "127.0.0.1", port: int = 0,
                 openmetrics: bool = True, settings: HttpServerSettings | None = None) -> None:
        self.render = render
        handler = type("_BoundHandler", (_Handler,), {"render": staticmethod(render), "openmetrics": openmetrics})
        super().__init__(handler, host, port, "prometheus-scrape", settings)

    @property
    def url(self) -> str:
        return f"{self.base_url}/metrics"


class _Handler(EndpointHandler):
    render: Callable[[bool], bytes]
    openmetrics: bool

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            openmetrics = self.openmetrics and negotiate(self.headers.get("Accept"))
            try:
                body = self.render(openmetrics)
            except Exception:
                logger.exception("rendering /metrics failed")
                self.send(500, CONTENT_TYPE_TEXT, b"internal error while rendering metrics\n")
                return
            self.send(200, CONTENT_TYPE_OPENMETRICS if openmetrics else CONTENT_TYPE_TEXT, body)
        elif path == "/":
            self.send(200, "text/plain; charset=utf-8", b"otel-llm collector: Prometheus metrics at /metrics\n")
        else:
            self.send(404, "text/plain; charset=utf-8", f"unknown path {path!r}; use /metrics\n".encode())
