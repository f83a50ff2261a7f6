"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}`.

`OpenAIError` is raised anywhere in a handler; the app's exception handlers turn
it (and FastAPI's request-validation errors, malformed JSON, and Starlette's own
HTTP errors: unknown path, wrong method, unreadable body) into the JSON body and
status OpenAI clients expect.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from otel_llm.export.redaction import echoed

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    """A request failure with its HTTP status; `param` names the offending field; `error_type`
    overrides the status's type (where vLLM writes another)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 error_type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code, self.error_type)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None,
               error_type: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type or _TYPES.get(status, "APIError"), "param": param,
                      "code": code if code is not None else status}}


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param)


async def openai_error_handler(request: Request, exc: OpenAIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":  # loc is ("body", character offset): no field to name
        param = None
        reason = first.get("ctx", {}).get("error") or first.get("msg", "invalid JSON")
        message = f"malformed JSON body: {reason} at character {'.'.join(loc)}"
    else:
        message = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}" for e in errors
        )
    return JSONResponse(error_body(422, message, param), status_code=422)


async def http_error_handler(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own errors (404 unknown path, 405 wrong method, 400 unreadable body)
    in OpenAI's shape instead of `{"detail": ...}`; their headers (a 405's `Allow`) are kept."""
    if isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI: "There was an error parsing the body"
        message = f"the request body is not valid UTF-8: {exc.__cause__}"
    elif exc.status_code in (404, 405):  # about the URL or the method: say which
        message = f"{exc.detail}: {echoed(request.method)} {echoed(request.url.path)}"
    else:
        message = str(exc.detail)
    return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code, headers=exc.headers)
