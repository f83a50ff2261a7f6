"""`create_app(config)`: the FastAPI application of `otel-llm serve` (and, with `pipeline`, of
`otel-llm serve-pipeline`: the engine is stage 0 of a text-to-speech pipeline, `otel_llm.server.pipeline`).
With `--api-key`, `/v1/*` answer 401 without the key (`api_key.ApiKeyAuth`); the rest stays open.

Its lifespan (`lifespan`) starts the engine (process or thread), waits for READY, builds the
telemetry SDK with the engine's `max_model_len`, and attaches the engine reader to this event
loop. Routes:

    POST /v1/completions, /v1/chat/completions   OpenAI (JSON or SSE)
    GET  /v1/models
    GET  /health                                  200; 503 with the reason while the engine is restarting or
                                                  once it will not be (then /v2/health/live is 503 too)
    GET  /metrics                                 the SDK's Prometheus exposition, then (serve-pipeline)
                                                  the pipeline families, then vLLM's http_* and the
                                                  process_*/python_* families (http_metrics)
    GET  /v2, /v2/health/{live,ready}, /v2/models/{name}/ready,
         /v2/models[/{name}[/versions/{version}]]/stats    Triton / KServe v2
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Route

from otel_llm.export.export_counts import ExportCounts
from otel_llm.export.otlp_metrics import service_resource
from otel_llm.export.redaction import redact_url
from otel_llm.server import protocol
from otel_llm.server.api import triton
from otel_llm.server.api.api_key import ApiKeyAuth
from otel_llm.server.api.arrival import ArrivalStamp
from otel_llm.server.api.body_limit import BodyLimit
from otel_llm.server.api.errors import OpenAIError, http_error_handler, openai_error_handler, validation_error_handler
from otel_llm.server.api.http_metrics import HttpMetrics
from otel_llm.server.api.lifespan import Exports, ServingState, lifespan
from otel_llm.server.api.read_timeouts import ReadTimeouts
from otel_llm.server.api.shutdown import ShutdownClock
from otel_llm.server.api.tracing import ServerSpanMiddleware, build_tracer_provider
from otel_llm.server.config import ServerConfig
from otel_llm.server.engine_client import EngineClient
from otel_llm.server.pipeline.pipeline_config import PipelineServerConfig


class _MetricsEndpoint:
    """Forwards to the SDK's ASGI metrics app (a Route, not a Mount: no 307 to `/metrics/`)."""

    async def __call__(self, scope, receive, send):
        await scope["app"].state.serving.metrics_app(scope, receive, send)


def create_app(config: ServerConfig, client: EngineClient | None = None, clock: ShutdownClock | None = None,
               pipeline: PipelineServerConfig | None = None) -> FastAPI:
    """The app; `client` is an already started engine (the CLI starts it first so
    engine config errors fail before the port is bound), else the lifespan starts one.
    `pipeline`: serve audio output through the talker stage (`otel-llm serve-pipeline`).
    The app owns the client either way and closes it at shutdown, within `clock`'s
    timeout (the CLI's `BoundedServer` starts it at the signal; default: at the lifespan's end)."""
    clock = clock or ShutdownClock(config.shutdown_timeout_s)
    resource = service_resource("otel-llm")  # one per server process: its own service.instance.id
    span_counts = ExportCounts("traces")
    # Tracing costs a span per request: on only when the spans go somewhere.
    tracer_provider = (build_tracer_provider(resource, config.otlp_traces_endpoint, span_counts)
                       if config.otlp_traces_endpoint else None)
    exports = Exports(resource, tracer_provider, span_counts, HttpMetrics(),
                      ReadTimeouts(config.header_timeout_s, config.body_timeout_s))

    app = FastAPI(title="otel-llm", lifespan=lifespan(config, client, clock, exports, pipeline),
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(OpenAIError, openai_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(HTTPException, http_error_handler)  # 404, 405, unreadable body
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)  # inside the server span: 413s are traced
    if tracer_provider is not None:
        app.add_middleware(ServerSpanMiddleware, tracer_provider=tracer_provider,
                           traceresponse=config.return_timings)
    if config.api_key is not None:  # outside the span (a stranger's requests make none), inside the counts
        app.add_middleware(ApiKeyAuth, api_key=config.api_key)
    app.router.routes.append(Route("/metrics", _MetricsEndpoint(), methods=["GET"]))
    app.include_router(triton.router)
    _add_openai_routes(app)
    exports.http_metrics.instrument(app)  # outside BodyLimit: its 413s are counted
    app.add_middleware(ArrivalStamp)  # outermost: stamps before parsing, tokenization, tracing
    app.state.read_timeouts = exports.read_timeouts  # the CLI's HTTP protocol enforces and counts them
    return app


def _add_openai_routes(app: FastAPI) -> None:
    @app.post("/v1/completions")
    async def completions(body: protocol.CompletionRequest, request: Request):
        return await request.app.state.serving.openai.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: protocol.ChatCompletionRequest, request: Request):
        return await request.app.state.serving.openai.chat(body, request)

    @app.get("/v1/models")
    async def models(request: Request):
        s: ServingState = request.app.state.serving
        return protocol.model_list(s.model_name, s.created, s.client.engine.max_model_len)

    @app.get("/health")
    async def health(request: Request):
        s: ServingState = request.app.state.serving
        engine = s.client.engine
        if engine.dead_reason is not None:  # restarting, or given up ("unhealthy")
            return JSONResponse({"status": "restarting" if engine.state == "restarting" else "unhealthy",
                                 "reason": engine.dead_reason, "engine_restarts": engine.restarts},
                                status_code=503)
        return {"status": "ok", "model": s.model_name, "in_flight": s.client.num_in_flight,
                "engine_restarts": engine.restarts,
                "otlp_traces_endpoint": redact_url(s.config.otlp_traces_endpoint),
                "otlp_metrics_endpoint": redact_url(s.config.otlp_metrics_endpoint),
                "exporters": {c.data_type: c.stats()._asdict() for c in s.exporters}}
