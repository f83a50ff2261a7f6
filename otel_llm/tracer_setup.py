"""Which TracerProvider a Telemetry uses, from its config and the standard OTEL_* environment."""

from __future__ import annotations

import logging
import os

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

logger = logging.getLogger("otel_llm")


def otlp_span_exporter(endpoint: str | None):
    """An OTLP span exporter; protocol from OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL, http/protobuf by default.

    `endpoint` (e.g. `--otlp-traces-endpoint`) is the full traces URL for HTTP
    (`http://host:4318/v1/traces`) or `host:port` for gRPC; None lets the exporter
    read OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT itself.
    """
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter(endpoint=endpoint, insecure=True) if endpoint else OTLPSpanExporter()
    if protocol != "http/protobuf":
        raise ValueError(f"unsupported OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} (use grpc or http/protobuf)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    if endpoint and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()


def batch_span_processor(exporter) -> BatchSpanProcessor:
    """A BatchSpanProcessor exporting small batches often (64 spans / 0.5 s) unless
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE / OTEL_BSP_SCHEDULE_DELAY say otherwise.

    The SDK's OTLP encoding costs ~45 us of Python per span; the default 512-span
    batches hold the GIL for ~25 ms at a time, which a streaming server's event loop
    feels as inter-token latency spikes. Small batches spread the same work out.
    """
    kwargs = {}
    if "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" not in os.environ:
        kwargs["max_export_batch_size"] = 64
    if "OTEL_BSP_SCHEDULE_DELAY" not in os.environ:
        kwargs["schedule_delay_millis"] = 500
    return BatchSpanProcessor(exporter, **kwargs)


def resolve_tracer_provider(config) -> TracerProvider | None:
    """config.tracer_provider; else an OTLP-exporting provider when an endpoint is configured;
    else the global provider if it is an SDK one; else None (no tracing, no cost)."""
    if config.tracer_provider is not None:
        return config.tracer_provider
    env_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if config.otlp_traces_endpoint or env_endpoint:
        provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "otel-llm")}))
        provider.add_span_processor(batch_span_processor(otlp_span_exporter(config.otlp_traces_endpoint)))
        return provider
    provider = trace_api.get_tracer_provider()
    return provider if isinstance(provider, TracerProvider) else None
