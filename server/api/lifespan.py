"""The API app's lifespan: what `otel-llm serve` builds once the engine is up, and tears down.

At start: the engine (unless the CLI started it first), the tokenizer, the `Telemetry` (with
the engine's `max_model_len`), the pipeline stack for `serve-pipeline`, the OTLP metrics push
and the `ServingState` every handler reads. At the end, within the shutdown clock: the engine,
the pipeline, then one last metrics export and the spans still queued (what does not finish
in time is dropped and logged).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI

from otel_llm import Telemetry, TelemetryConfig
from otel_llm.canonical.instruments import Kind
from otel_llm.export.asgi import make_metrics_app
from otel_llm.export.export_counts import ExportCounts, exporter_families
from otel_llm.export.exposition import SelfFamily
from otel_llm.export.otlp_metrics import export_interval_s, otlp_metric_reader
from otel_llm.export.redaction import redact_url
from otel_llm.export.span_encoding import replaced_characters
from otel_llm.server.api.http_metrics import HttpMetrics
from otel_llm.server.api.read_timeouts import ReadTimeouts
from otel_llm.server.api.serving import OpenAIServing
from otel_llm.server.api.shutdown import ShutdownClock, finish_within
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


@dataclass(frozen=True)
class Exports:
    """Where the server's telemetry goes, built before the app (the span pipeline wraps it)."""

    resource: object  # the SDK Resource of this server process
    tracer_provider: object | None  # None: tracing off (no --otlp-traces-endpoint)
    span_counts: ExportCounts
    http_metrics: HttpMetrics
    read_timeouts: ReadTimeouts  # the HTTP protocol's header and body deadlines, and what they closed


def telemetry_config(config: ServerConfig, model_name: str, max_model_len: int, tracer_provider,
                     pipeline: PipelineServerConfig | None) -> TelemetryConfig:
    """The SDK's configuration from the server's flags and what the engine said at READY."""
    return TelemetryConfig(
        model_name=model_name, engine="0", enabled=config.engine.log_stats,
        log_stats_interval_s=config.log_stats_interval_s, max_model_len=max_model_len,
        cache_config={"block_size": str(config.engine.block_size),
                      "num_gpu_blocks": str(config.engine.num_kv_blocks or ""),
                      "enable_prefix_caching": str(config.engine.enable_prefix_caching)},
        metrics_compat=config.metrics_compat, tracing=tracer_provider is not None,
        custom_histogram_buckets=config.custom_histogram_buckets,
        show_hidden_metrics_for_version=config.show_hidden_metrics_for_version,
        cardinality_limit=config.cardinality_limit,
        kv_cache_metrics=config.engine.kv_cache_metrics_sample > 0,
        mfu_metrics=config.mfu_metrics,
        tracer_provider=tracer_provider,
        kv_device=_kv_device(config.engine.device),
        stage_replica=None if pipeline is None else STAGE_REPLICA,
        slo=config.slo,
    )


def _kv_device(device: str) -> str:
    """The word in the stat log line ("GPU KV cache usage")."""
    if device == "auto":
        import torch

        return "GPU" if torch.cuda.is_available() else "CPU"
    return "CPU" if device == "cpu" else "GPU"


def _restarts_family(client: EngineClient) -> SelfFamily:
    return SelfFamily("otel_llm_engine_restarts", Kind.COUNTER,
                      "Engines started after the engine died or hung (--engine-restarts).",
                      (("", client.engine.restarts),))


def _replaced_family() -> SelfFamily:
    return SelfFamily("otel_llm_span_characters_replaced", Kind.COUNTER,
                      "Characters of span strings UTF-8 cannot encode (lone surrogates), exported as U+FFFD.",
                      (("", replaced_characters()),))


def _joined(*renders):
    """One `make_metrics_app(extra=...)` from several: their families in order."""
    return lambda openmetrics, compat: b"".join(render(openmetrics, compat) for render in renders)


def lifespan(config: ServerConfig, client: EngineClient | None, clock: ShutdownClock, exports: Exports,
             pipeline: PipelineServerConfig | None):
    """The app's lifespan (FastAPI's `lifespan=`); `client`: an engine the CLI already started."""

    @asynccontextmanager
    async def serving(app: FastAPI):
        engine = client
        stack = reader = None
        if engine is None:
            engine = EngineClient(config)
            await asyncio.to_thread(engine.start)
        try:
            tokenizer = await asyncio.to_thread(load_tokenizer, config.engine.model)
            model_name = config.served_model_name or engine.engine.model_name
            tel = Telemetry(telemetry_config(config, model_name, engine.engine.max_model_len,
                                             exports.tracer_provider, pipeline))
            if pipeline is not None:
                stack = PipelineStack(pipeline, model_name, config.engine.log_stats, config.cardinality_limit,
                                      exports.tracer_provider, config.log_stats_interval_s, tel)
            engine.attach(asyncio.get_running_loop(), tel)
            counts = (exports.span_counts,) if exports.tracer_provider is not None else ()
            if config.otlp_metrics_endpoint and tel.enabled:
                metric_counts = ExportCounts("metrics")
                reader = otlp_metric_reader(config.otlp_metrics_endpoint, counts=metric_counts)
                counts += (metric_counts,)
                tel.attach_reader(reader, exports.resource, () if stack is None else (stack.telemetry.to_metrics,))
                logger.info("pushing OTLP metrics to %s every %.0f s", redact_url(config.otlp_metrics_endpoint),
                            export_interval_s())
        except BaseException:
            engine.close()
            if stack is not None:
                stack.close()
            raise
        extra = exports.http_metrics.render if stack is None else _joined(stack.render, exports.http_metrics.render)
        traced = exports.tracer_provider is not None
        app.state.serving = ServingState(
            config, engine, tel, OpenAIServing(engine, tel, tokenizer, model_name,
                                               audio=None if stack is None else stack.serving),
            make_metrics_app([tel], config.metrics_compat, lambda: [*exporter_families(counts),
                                                                   _restarts_family(engine),
                                                                   exports.read_timeouts.family(),
                                                                   *([_replaced_family()] if traced else [])],
                             extra=extra),
            model_name, int(time.time()), counts,
        )
        logger.info("serving %s on %s://%s:%d%s", model_name, config.scheme, config.host, config.port,
                    " (/v1/* need the API key)" if config.api_key else "")
        try:
            yield
        finally:
            clock.begin()
            await asyncio.to_thread(engine.close)
            if stack is not None:
                await asyncio.to_thread(stack.close)
            tel.shutdown()
            await _flush(reader, exports.tracer_provider, clock, counts)

    return serving


async def _flush(reader, tracer_provider, clock: ShutdownClock, counts: tuple[ExportCounts, ...]) -> None:
    """One last metrics export and the spans still queued, in what is left of the shutdown clock."""
    flushes = {}
    if reader is not None:
        flushes["metrics"] = lambda: reader.shutdown(timeout_millis=clock.remaining() * 1000)
    if tracer_provider is not None:
        flushes["spans"] = tracer_provider.shutdown
    unfinished = await finish_within(clock.remaining(), flushes)
    if unfinished:
        logger.warning("shutdown: the %s export did not finish within --shutdown-timeout %g s; what it "
                       "still held is dropped (%s)", " and ".join(unfinished), clock.timeout_s,
                       "; ".join(f"{c.data_type}: {c.stats()}" for c in counts))
