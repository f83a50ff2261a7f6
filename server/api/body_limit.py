"""`BodyLimit`: requests larger than `--max-request-bytes` are answered 413 before their body is read.

A declared `Content-Length` above the limit is refused at once, without reading a byte
of the body; a chunked body is counted as it arrives and refused as soon as it passes
the limit (its request has not been answered yet: the handler reads the whole body
before it runs). Either way the connection is closed, so the rest is never read.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException

from server.api.errors import error_body


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
            if length.isdigit() and int(length) <= self.max_bytes:
                await self.app(scope, receive, send)
            else:
                await self._refuse(send)
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

    async def _refuse(self, send) -> None:
        body = json.dumps(error_body(413, self._message)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
