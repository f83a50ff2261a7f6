"""Triton / KServe v2 endpoints: server metadata, health, readiness, statistics.

Statistics follow Triton's statistics extension (`$stats_model_response`); an
unknown model or version is a 400 with `{"error": "..."}`
(`$repository_statistics_error_response`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from otel_llm.export.redaction import echoed
from otel_llm.frontend.triton_stats import UnknownModel, statistics_response

router = APIRouter()


def _state(request: Request):
    return request.app.state.serving


@router.get("/v2")
async def server_metadata(request: Request) -> JSONResponse:
    from otel_llm.server import __version__

    return JSONResponse({"name": "otel-llm", "version": __version__, "extensions": ["statistics"]})


@router.get("/v2/health/live")
async def live(request: Request) -> Response:
    """Alive while it serves or is restarting its engine; not once it gave up (restart the server)."""
    return Response(status_code=503 if _state(request).client.engine.given_up else 200)


@router.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if _state(request).client.dead_reason is None else 503)


@router.get("/v2/models/{name}/ready")
async def model_ready(name: str, request: Request) -> Response:
    serving = _state(request)
    if name != serving.model_name:
        return JSONResponse({"error": f"Request for unknown model: '{echoed(name)}' is not found"}, status_code=400)
    return Response(status_code=200 if serving.client.dead_reason is None else 503)


@router.get("/v2/models/stats")
async def all_stats(request: Request) -> JSONResponse:
    return _stats(request, None, None)


@router.get("/v2/models/{name}/stats")
async def model_stats(name: str, request: Request) -> JSONResponse:
    return _stats(request, name, None)


@router.get("/v2/models/{name}/versions/{version}/stats")
async def version_stats(name: str, version: str, request: Request) -> JSONResponse:
    return _stats(request, name, version)


def _stats(request: Request, name: str | None, version: str | None) -> JSONResponse:
    try:
        return JSONResponse(statistics_response([_state(request).tel], name=name, version=version))
    except UnknownModel as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
