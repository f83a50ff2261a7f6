"""A complete ASGI `/metrics` endpoint (mount it in FastAPI/Starlette, or serve it alone).

Content negotiation: OpenMetrics 1.0 when the `Accept` header asks for it
(Prometheus does), else text format 0.0.4. Snapshotting holds each Telemetry's
lock only to copy aggregates; rendering runs in a worker thread so a scrape
never stalls streaming responses on the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import anyio

from .exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT, Renderer, SelfFamily, negotiate
from .profiles import get_profile


def make_metrics_app(telemetries, profile: str = "vllm", own: Callable[[], Iterable[SelfFamily]] | None = None):
    """`own`: more families (e.g. `export_counts.exporter_families`), rendered after the telemetries'."""
    renderer = Renderer(get_profile(profile, max((t.config.max_model_len for t in telemetries), default=8192)))
    lock = threading.Lock()  # the renderer's cache is not thread-safe

    def render(openmetrics: bool) -> bytes:
        sources = [t.source() for t in telemetries if t.enabled]
        families = tuple(own()) if own is not None else ()
        with lock:
            return renderer.render(sources, openmetrics, families)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await send({"type": "http.response.start", "status": 405,
                        "headers": [(b"content-type", b"text/plain"), (b"allow", b"GET, HEAD")]})
            await send({"type": "http.response.body", "body": b"method not allowed\n"})
            return
        accept = dict(scope.get("headers") or []).get(b"accept", b"").decode("latin-1")
        openmetrics = negotiate(accept)
        body = await anyio.to_thread.run_sync(render, openmetrics)
        ctype = CONTENT_TYPE_OPENMETRICS if openmetrics else CONTENT_TYPE_TEXT
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    return app
