"""Request arrival, stamped when the HTTP server reads the request, not when the app runs.

Under a burst, uvicorn reads and parses many requests in one event-loop pass and
queues one task each; a stamp taken when the app starts would miss the time each
request waited in that queue (tens of ms at 64 simultaneous requests on 2 cores).
`stamping_protocol()` subclasses uvicorn's HTTP protocol (httptools when
installed, else h11, like uvicorn's "auto") and stamps `scope["state"]
["arrival_ns"]` (monotonic ns) when the data that completed a request's headers
arrived. `ArrivalStamp`, the outermost ASGI middleware, stamps requests that
come through any other server (`setdefault`: the earlier stamp wins).
"""

from __future__ import annotations

import time


def _stamp(scope: dict, now_ns: int) -> None:
    scope.setdefault("state", {}).setdefault("arrival_ns", now_ns)


def stamping_protocol() -> type:
    """uvicorn's HTTP protocol class with arrival stamping (pass as `uvicorn.run(http=...)`)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class StampingProtocol(base):
        def data_received(self, data: bytes) -> None:
            now = time.monotonic_ns()
            super().data_received(data)
            scope = getattr(self, "scope", None)  # the latest request on this connection
            if scope is not None:  # a new request's scope has no stamp yet; an older one keeps its own
                _stamp(scope, now)

    return StampingProtocol


class ArrivalStamp:
    """ASGI middleware: stamps arrival (if the server did not) before anything else runs."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            _stamp(scope, time.monotonic_ns())
        await self.app(scope, receive, send)
