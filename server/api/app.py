"""`create_app(config)`: the FastAPI application of `otel-llm serve` (and, with `pipeline`, of
`otel-llm serve-pipeline`: the engine is stage 0 of a text-to-speech pipeline, `otel_llm.server.pipeline`).

The lifespan starts the engine (process or thread), waits for READY, builds the
telemetry SDK with the engine's `max_model_len`, and attaches the engine reader
to this event loop. Routes:

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

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Route

from otel_llm import Telemetry, TelemetryConfig
from otel_llm.canonical.instruments import Kind
from otel_llm.export.asgi import make_metrics_app
from otel_llm.export.export_counts import ExportCounts, exporter_families
from otel_llm.export.exposition import SelfFamily
from otel_llm.export.otlp_metrics import otlp_metric_reader, service_resource
from otel_llm.export.redaction import redact_url
from otel_llm.server import protocol
from otel_llm.server.api import triton
from otel_llm.server.api.arrival import ArrivalStamp
from otel_llm.server.api.body_limit import BodyLimit
from otel_llm.server.api.errors import OpenAIError, http_error_handler, openai_error_handler, validation_error_handler
from otel_llm.server.api.http_metrics import HttpMetrics
from otel_llm.server.api.serving import OpenAIServing
from otel_llm.server.api.shutdown import ShutdownClock, finish_within
from otel_llm.server.api.tracing import ServerSpanMiddleware, build_tracer_provider
from otel_llm.server.config import ServerConfig
from otel_llm.server.engine_client import EngineClient
from otel_llm.server.model import load_tokenizer
from otel_llm.server.pipeline.pipeline_app import STAGE_REPLICA, PipelineStack
from otel_llm.server.pipeline.pipeline_config import PipelineServerConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingState:
    """What the handlers share, built once in the lifespan (`app.state.serving`)."""

    config: ServerConfig
    client: EngineClient
    tel: Telemetry
    openai: OpenAIServing
    metrics_app: object  # ASGI
    model_name: str
    created: int
    exporters: tuple[ExportCounts, ...] = ()  # what the OTLP exporters sent, failed to send, dropped


def _kv_device(device: str) -> str:
    """The word in the stat log line ("GPU KV cache usage")."""
    if device == "auto":
        import torch

        return "GPU" if torch.cuda.is_available() else "CPU"
    return "CPU" if device == "cpu" else "GPU"


def _restarts_family(client: EngineClient) -> SelfFamily:
    return SelfFamily("otel_llm_engine_restarts", Kind.COUNTER,
                      "Engines started after the engine died or hung (--engine-restarts).", (("", client.restarts),))


def _joined(*renders):
    """One `make_metrics_app(extra=...)` from several: their families in order."""
    return lambda openmetrics: b"".join(render(openmetrics) for render in renders)


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
    # Tracing costs a span per request: on only when the spans go somewhere.
    span_counts = ExportCounts("traces")
    tracer_provider = (build_tracer_provider(resource, config.otlp_traces_endpoint, span_counts)
                       if config.otlp_traces_endpoint else None)
    http_metrics = HttpMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = client
        stack = None
        if engine is None:
            engine = EngineClient(config)
            await asyncio.to_thread(engine.start)
        try:
            tokenizer = await asyncio.to_thread(load_tokenizer, config.engine.model)
            model_name = config.served_model_name or engine.model_name
            tel = Telemetry(TelemetryConfig(
                model_name=model_name, engine="0", enabled=config.engine.log_stats,
                log_stats_interval_s=config.log_stats_interval_s, max_model_len=engine.max_model_len,
                cache_config={"block_size": str(config.engine.block_size),
                              "num_gpu_blocks": str(config.engine.num_kv_blocks or ""),
                              "enable_prefix_caching": str(config.engine.enable_prefix_caching)},
                metrics_compat=config.metrics_compat, tracing=tracer_provider is not None,
                custom_histogram_buckets=config.custom_histogram_buckets,
                show_hidden_metrics_for_version=config.show_hidden_metrics_for_version,
                cardinality_limit=config.cardinality_limit,
                kv_cache_metrics=config.engine.kv_cache_metrics_sample > 0,
                tracer_provider=tracer_provider,
                kv_device=_kv_device(config.engine.device),
                stage_replica=None if pipeline is None else STAGE_REPLICA,
            ))
            if pipeline is not None:
                stack = PipelineStack(pipeline, model_name, config.engine.log_stats, config.cardinality_limit,
                                      tracer_provider, config.log_stats_interval_s)
            engine.attach(asyncio.get_running_loop(), tel)
            reader = None
            exporters = (span_counts,) if tracer_provider is not None else ()
            if config.otlp_metrics_endpoint and tel.enabled:
                metric_counts = ExportCounts("metrics")
                reader = otlp_metric_reader(config.otlp_metrics_endpoint, counts=metric_counts)
                exporters += (metric_counts,)
                tel.attach_reader(reader, resource)
                logger.info("pushing OTLP metrics to %s every %.0f s", redact_url(config.otlp_metrics_endpoint),
                            reader._export_interval_millis / 1000)
        except BaseException:
            engine.close()
            if stack is not None:
                stack.close()
            raise
        extra = http_metrics.render if stack is None else _joined(stack.render, http_metrics.render)
        app.state.serving = ServingState(
            config, engine, tel, OpenAIServing(engine, tel, tokenizer, model_name,
                                               audio=None if stack is None else stack.serving),
            make_metrics_app([tel], config.metrics_compat, lambda: [*exporter_families(exporters),
                                                                   _restarts_family(engine)],
                             extra=extra),
            model_name, int(time.time()), exporters,
        )
        logger.info("serving %s on http://%s:%d", model_name, config.host, config.port)
        try:
            yield
        finally:
            clock.begin()
            await asyncio.to_thread(engine.close)
            if stack is not None:
                await asyncio.to_thread(stack.close)
            tel.shutdown()
            flushes = {}
            if reader is not None:  # one last export
                flushes["metrics"] = lambda: reader.shutdown(timeout_millis=clock.remaining() * 1000)
            if tracer_provider is not None:  # the spans still queued
                flushes["spans"] = tracer_provider.shutdown
            unfinished = await finish_within(clock.remaining(), flushes)
            if unfinished:
                logger.warning("shutdown: the %s export did not finish within --shutdown-timeout %g s; what it "
                               "still held is dropped (%s)", " and ".join(unfinished), clock.timeout_s,
                               "; ".join(f"{c.data_type}: {c.stats()}" for c in exporters))

    app = FastAPI(title="otel-llm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(OpenAIError, openai_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(HTTPException, http_error_handler)  # 404, 405, unreadable body
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)  # inside the server span: 413s are traced
    if tracer_provider is not None:
        app.add_middleware(ServerSpanMiddleware, tracer_provider=tracer_provider)
    app.router.routes.append(Route("/metrics", _MetricsEndpoint(), methods=["GET"]))
    app.include_router(triton.router)

    @app.post("/v1/completions")
    async def completions(body: protocol.CompletionRequest, request: Request):
        return await request.app.state.serving.openai.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: protocol.ChatCompletionRequest, request: Request):
        return await request.app.state.serving.openai.chat(body, request)

    @app.get("/v1/models")
    async def models(request: Request):
        s: ServingState = request.app.state.serving
        return protocol.model_list(s.model_name, s.created, s.client.max_model_len)

    @app.get("/health")
    async def health(request: Request):
        s: ServingState = request.app.state.serving
        if s.client.dead_reason is not None:  # restarting, or given up ("unhealthy")
            return JSONResponse({"status": "restarting" if s.client.state == "restarting" else "unhealthy",
                                 "reason": s.client.dead_reason, "engine_restarts": s.client.restarts},
                                status_code=503)
        return {"status": "ok", "model": s.model_name, "in_flight": s.client.num_in_flight,
                "engine_restarts": s.client.restarts,
                "otlp_traces_endpoint": redact_url(s.config.otlp_traces_endpoint),
                "otlp_metrics_endpoint": redact_url(s.config.otlp_metrics_endpoint),
                "exporters": {c.data_type: c.stats()._asdict() for c in s.exporters}}

    http_metrics.instrument(app)  # outside BodyLimit: its 413s are counted
    app.add_middleware(ArrivalStamp)  # outermost: stamps before parsing, tokenization, tracing
    return app
