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
    from .otlp_encoding import FastOTLPSpanExporter  # the SDK's HTTP exporter, encoding ~3.5x cheaper

    if endpoint and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return FastOTLPSpanExporter(endpoint=endpoint) if endpoint else FastOTLPSpanExporter()


def batch_span_processor(exporter) -> BatchSpanProcessor:
    """A BatchSpanProcessor: 512-span batches (the SDK's default) at least every 0.5 s
    from a queue of 8192 spans, unless OTEL_BSP_* say otherwise.

    The export runs on the processor's thread but holds the GIL while it encodes
    (~13 us per span with `FastOTLPSpanExporter`, ~45 us with the SDK's encoder), so a
    batch costs the event loop at most one switch interval (5 ms) at a time; each HTTP
    POST costs ~1.5 ms of Python whatever its size, which large batches amortise. The
    queue holds a burst of ~1600 requests' spans; beyond that the SDK drops (and logs).
    """
    kwargs = {}
    for env, key, value in (("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "max_export_batch_size", 512),
                            ("OTEL_BSP_SCHEDULE_DELAY", "schedule_delay_millis", 500),
                            ("OTEL_BSP_MAX_QUEUE_SIZE", "max_queue_size", 8192)):
        if env not in os.environ:
            kwargs[key] = value
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
