"""OTLP metrics push for a Telemetry, from its config and the standard OTEL_* environment (optionally counted)."""

from __future__ import annotations

import os
import uuid

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from otel_llm.export.export_counts import ExportCounts


def otlp_metric_exporter(endpoint: str | None):
    """An OTLP metric exporter; protocol from OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL
    (`http/protobuf` by default, or `grpc`).

    `endpoint` is the metrics URL for HTTP (`/v1/metrics` is appended when missing,
    so a collector's base URL works) or `host:port` / `http://host:port` for gRPC;
    None lets the exporter read OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT itself.
    """
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        return OTLPMetricExporter(endpoint=endpoint, insecure=True) if endpoint else OTLPMetricExporter()
    if protocol != "http/protobuf":
        raise ValueError(f"unsupported OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} (use grpc or http/protobuf)")
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    if endpoint and not endpoint.rstrip("/").endswith("/v1/metrics"):
        endpoint = endpoint.rstrip("/") + "/v1/metrics"
    return OTLPMetricExporter(endpoint=endpoint) if endpoint else OTLPMetricExporter()


def otlp_metric_reader(endpoint: str | None, interval_s: float | None = None,
                       counts: ExportCounts | None = None) -> PeriodicExportingMetricReader:
    """A periodic OTLP reader; every OTEL_METRIC_EXPORT_INTERVAL ms (60 s by default) unless `interval_s`;
    with `counts`, its exports are counted into them (`CountingMetricExporter`)."""
    millis = None if interval_s is None else interval_s * 1000
    exporter = otlp_metric_exporter(endpoint)
    if counts is not None:
        exporter = CountingMetricExporter(exporter, counts)
    return PeriodicExportingMetricReader(exporter, export_interval_millis=millis)


class CountingMetricExporter(MetricExporter):
    """`exporter`, counting the data points of each export `sent` (SUCCESS) or `send_failed`
    (FAILURE, or it raised). A periodic reader has no queue: nothing is `enqueue_failed`."""

    def __init__(self, exporter: MetricExporter, counts: ExportCounts):
        # The reader takes its temporality and aggregation preferences from its exporter.
        super().__init__(exporter._preferred_temporality, exporter._preferred_aggregation)
        self.exporter, self._counts = exporter, counts

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        points = sum(len(m.data.data_points) for rm in metrics_data.resource_metrics
                     for sm in rm.scope_metrics for m in sm.metrics)
        try:
            result = self.exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            self._counts.add(send_failed=points)
            raise  # the reader logs it
        if result is MetricExportResult.SUCCESS:
            self._counts.add(sent=points)
        else:
            self._counts.add(send_failed=points)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.exporter.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


def service_resource(default_service_name: str) -> Resource:
    """The process's Resource: OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, else `default_service_name`,
    and a `service.instance.id` unique to this process unless one is configured (so series of two
    servers, or of one server before and after a restart, never collide)."""
    resource = Resource.create()
    if resource.attributes.get("service.name", "unknown_service").startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": default_service_name}))
    if "service.instance.id" not in resource.attributes:
        resource = resource.merge(Resource({"service.instance.id": str(uuid.uuid4())}))
    return resource
