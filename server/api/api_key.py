"""`ApiKeyAuth`: `otel-llm serve --api-key KEY` (or `$OTEL_LLM_API_KEY`), as vLLM's `--api-key`.

A request whose path starts with `/v1` (the OpenAI API; vLLM's rule) needs `Authorization: Bearer
KEY`; without it, or with another key, the answer is 401 with OpenAI's error JSON (type
`AuthenticationError`, code `invalid_api_key`: the `openai` client raises `AuthenticationError`)
and `WWW-Authenticate: Bearer` (RFC 6750). Everything else stays open, as vLLM leaves it: `/health`,
`/metrics`, Triton's `/v2` health and statistics. `OPTIONS` passes (vLLM: CORS preflight).

The key and the presented token are compared as SHA-256 digests with `hmac.compare_digest`:
constant time, whatever their lengths. Neither is logged nor echoed.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi.responses import JSONResponse

from otel_llm.server.api.errors import error_body

_PROTECTED_PREFIX = "/v1"
_MISSING = "no API key: this server needs one, sent as `Authorization: Bearer <key>`"
_WRONG = "incorrect API key"


class ApiKeyAuth:
    """ASGI middleware; `api_key` non-empty."""

    def __init__(self, app, api_key: str):
        self.app = app
        self._digest = hashlib.sha256(api_key.encode()).digest()

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["method"] == "OPTIONS"
                or not scope["path"].startswith(_PROTECTED_PREFIX)):
            await self.app(scope, receive, send)
            return
        problem = self._problem(scope["headers"])
        if problem is None:
            await self.app(scope, receive, send)
            return
        response = JSONResponse(error_body(401, problem, code="invalid_api_key"), status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def _problem(self, headers) -> str | None:
        """None when the request carries the key; else what the client is told."""
        value = next((v for name, v in headers if name == b"authorization"), None)
        if value is None:
            return _MISSING
        scheme, _, token = value.partition(b" ")
        if scheme.lower() != b"bearer":
            return _MISSING
        return None if hmac.compare_digest(hashlib.sha256(token.strip()).digest(), self._digest) else _WRONG
