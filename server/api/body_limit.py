"""`BodyLimit`: requests larger than `--max-request-bytes` are answered 413 before their body is read.

A declared `Content-Length` above the limit is refused at once, without reading a byte
of the body; a chunked body is counted as it arrives and refused as soon as it passes
the limit (its request has not been answered yet: the handler reads the whole body
before it runs). Either way the connection is closed, so the rest is never processed.

A client that sends its declared body before it reads the answer (httpx, and so the `openai`
SDK) would see the close as a connection reset and lose the 413 (the kernel resets a socket
closed with unread data), so a declared body of up to `_DRAIN_MAX_BYTES` is read and
discarded after the answer is sent, for at most `_DRAIN_TIMEOUT_S`, before the close, as
HTTP servers' "lingering close" does; not with `Expect: 100-continue` (that client waits).
"""

from __future__ import annotations

import asyncio
import json

from starlette.exceptions import HTTPException

from otel_llm.server.api.errors import error_body

_DRAIN_MAX_BYTES = 64 << 20
_DRAIN_TIMEOUT_S = 10.0


class _TooLarge(HTTPException):
    """Raised from `receive`: FastAPI passes an HTTPException from the body read through (any
    other exception there becomes a 400), and the app's HTTPException handler answers it."""


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes
        self._message = f"the request body exceeds the server's limit of {max_bytes} bytes (--max-request-bytes)"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None:  # the HTTP server reads no more than it declares
            size = int(length) if length.isdigit() else None
            if size is not None and size <= self.max_bytes:
                await self.app(scope, receive, send)
            else:
                drain = (size is not None and size <= _DRAIN_MAX_BYTES
                         and not any(k == b"expect" for k, _ in scope["headers"]))
                await self._refuse(send, receive if drain else None)
            return
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise _TooLarge(413, self._message)
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send, drain_from=None) -> None:
        """Answer 413; with `drain_from` (the request's `receive`), read and discard the body
        before the response ends (the whole answer is already sent: only the close waits)."""
        body = json.dumps(error_body(413, self._message)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body, "more_body": drain_from is not None})
        if drain_from is not None:
            try:
                await asyncio.wait_for(_discard(drain_from), _DRAIN_TIMEOUT_S)
            except asyncio.TimeoutError:
                pass
            await send({"type": "http.response.body", "body": b""})


async def _discard(receive) -> None:
    """Read the request body to its end (or the client's disconnect), keeping nothing."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
