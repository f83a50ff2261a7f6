"""Request arrival, stamped when the HTTP server reads the request, not when the app runs.

Under a burst, uvicorn reads and parses many requests in one event-loop pass and
queues one task each; a stamp taken when the app starts would miss the time each
request waited in that queue (tens of ms at 64 simultaneous requests on 2 cores).
`stamping_protocol()` subclasses uvicorn's HTTP protocol (httptools when
installed, else h11, like uvicorn's "auto") and stamps `scope["state"]
["arrival_ns"]` (monotonic ns) when the data that completed a request's headers
arrived. `ArrivalStamp`, the outermost ASGI middleware, stamps requests that
come through any other server (`setdefault`: the earlier stamp wins).

When the event loop is busy, a request also waits in the kernel's socket buffer
before uvicorn reads it (~10 ms per request under a 64-request burst here).
On Linux the protocol asks the kernel how long ago the connection last received
data (`TCP_INFO.tcpi_last_data_recv`) and stamps that moment instead. The
kernel counts in jiffies (4 ms at HZ=250), so one request's stamp can be a tick
off, but the error averages out: a wait of w ms reads as a multiple of the tick
whose expected value is w. The stamp is never later than the read.
"""

from __future__ import annotations

import socket
import struct
import time

_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux only
_LAST_DATA_RECV = struct.Struct("I")  # struct tcp_info.tcpi_last_data_recv, ms, at byte 52


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
            if scope is not None and "arrival_ns" not in scope.setdefault("state", {}):  # a new request
                scope["state"]["arrival_ns"] = min(now, _kernel_arrival_ns(self.transport))

    return StampingProtocol


def _kernel_arrival_ns(transport) -> int:
    """When the kernel last received data on the transport's TCP socket (monotonic ns), or
    now where it cannot say (not Linux, not TCP)."""
    now = time.monotonic_ns()
    sock = transport.get_extra_info("socket") if _TCP_INFO is not None else None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 56)
    except (AttributeError, OSError):
        return now
    return now - _LAST_DATA_RECV.unpack_from(info, 52)[0] * 1_000_000 if len(info) >= 56 else now


class ArrivalStamp:
    """ASGI middleware: stamps arrival (if the server did not) before anything else runs."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            _stamp(scope, time.monotonic_ns())
        await self.app(scope, receive, send)
