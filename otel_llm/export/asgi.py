"""A complete ASGI `/metrics` endpoint (mount it in FastAPI/Starlette, or serve it alone).

Content negotiation: OpenMetrics 1.0 when the `Accept` header asks for it
(Prometheus does), else text format 0.0.4. Snapshotting holds each Telemetry's
lock only to copy aggregates; rendering runs in a worker thread so a scrape
never stalls streaming responses on the event loop (anyio's, as Starlette runs; asyncio's
when anyio is not installed). `?compat=NAME` serves any
profile (`profiles.PROFILE_NAMES`) from the same aggregates, so a mixed fleet
can be scraped under one name set.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from urllib.parse import parse_qs

try:
    from anyio import to_thread
except ImportError:  # no Starlette/FastAPI here: asyncio's worker threads
    to_thread = None

from otel_llm.canonical.cardinality import DEFAULT_CARDINALITY_LIMIT
from otel_llm.export.exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT, Renderer, SelfFamily, negotiate
from otel_llm.shim.profile import Profile
from otel_llm.shim.profiles import PROFILE_NAMES, get_profile


def _compat(query: bytes, default: str) -> str:
    """The profile a scrape asks for (`?compat=NAME`, so a mixed fleet scrapes one name set)."""
    values = parse_qs(query.decode("latin-1")).get("compat")
    return values[-1] if values else default


def make_metrics_app(telemetries, profile: str = "vllm", own: Callable[[], Iterable[SelfFamily]] | None = None,
                     extra: Callable[[bool, str], bytes] | None = None):
    """`own`: more families (e.g. `export_counts.exporter_families`), rendered after the telemetries'.
    `extra(openmetrics, compat)`: rendered families appended last, in the served format and the scrape's
    profile, without `# EOF`."""
    max_len = max((t.config.max_model_len for t in telemetries), default=8192)
    config = telemetries[0].config if telemetries else None

    def table(name: str) -> Profile:  # the first Telemetry's: stage/replica Telemetries are served together
        return config.profile(name) if config is not None else get_profile(name, max_len)

    limit = config.cardinality_limit if config is not None else DEFAULT_CARDINALITY_LIMIT
    renderers = {profile: Renderer(table(profile), limit)}  # `?compat=NAME` adds the others
    lock = threading.Lock()  # the renderers' caches are not thread-safe

    def render(openmetrics: bool, compat: str) -> tuple[bytes, bool]:
        """(the exposition, whether it is OpenMetrics: not for profiles of text-only servers)"""
        sources = [t.source(exemplars=openmetrics) for t in telemetries if t.enabled]  # text shows none
        families = tuple(own()) if own is not None else ()
        with lock:
            renderer = renderers.get(compat)
            if renderer is None:
                renderer = renderers[compat] = Renderer(table(compat), limit)
            openmetrics = openmetrics and renderer.profile.openmetrics
            body = renderer.render(sources, openmetrics, families)
        if extra is not None:  # its families go before the one OpenMetrics `# EOF`
            eof = b"# EOF\n" if openmetrics else b""
            body = body.removesuffix(eof) + extra(openmetrics, compat) + eof
        return body, openmetrics

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await send({"type": "http.response.start", "status": 405,
                        "headers": [(b"content-type", b"text/plain"), (b"allow", b"GET, HEAD")]})
            await send({"type": "http.response.body", "body": b"method not allowed\n"})
            return
        compat = _compat(scope.get("query_string", b""), profile)
        if compat not in PROFILE_NAMES:
            body = f"unknown compat {compat!r}: expected one of {', '.join(PROFILE_NAMES)}\n".encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        accept = dict(scope.get("headers") or []).get(b"accept", b"").decode("latin-1")
        render_args = (render, negotiate(accept), compat)
        body, openmetrics = await (to_thread.run_sync(*render_args) if to_thread else asyncio.to_thread(*render_args))
        ctype = CONTENT_TYPE_OPENMETRICS if openmetrics else CONTENT_TYPE_TEXT
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    return app
