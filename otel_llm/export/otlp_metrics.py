"""OTLP metrics push for a Telemetry, from its config and the standard OTEL_* environment (optionally counted)."""

from __future__ import annotations

import logging
import os
import uuid

from opentelemetry.sdk.metrics.export import (
    MetricExporter, MetricExportResult, MetricsData, PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from otel_llm.export.export_counts import ExportCounts
from otel_llm.export.final_export import stop_retries
from otel_llm.export.otlp_endpoint import otlp_exporter

logger = logging.getLogger("otel_llm")


def otlp_metric_exporter(endpoint: str | None):
    """An OTLP metric exporter (see `otlp_endpoint.otlp_exporter`: protocol and endpoint)."""
    return otlp_exporter("metrics", endpoint, _grpc_exporter, _http_exporter)


def _grpc_exporter() -> type:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter


def _http_exporter() -> type:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter


def export_interval_s(interval_s: float | None = None) -> float:
    """`interval_s`, else OTEL_METRIC_EXPORT_INTERVAL (ms), else 60 s: the SDK's reading of it
    (an unreadable value is warned about and the default used)."""
    if interval_s is not None:
        return interval_s
    try:
        return float(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", 60000)) / 1000
    except ValueError:
        logger.warning("OTEL_METRIC_EXPORT_INTERVAL %r is not a number of ms; using 60000",
                       os.environ["OTEL_METRIC_EXPORT_INTERVAL"])
        return 60.0


def otlp_metric_reader(endpoint: str | None, interval_s: float | None = None,
                       counts: ExportCounts | None = None) -> PeriodicExportingMetricReader:
    """A periodic OTLP reader, every `export_interval_s(interval_s)`; with `counts`, its exports are
    counted into them (`CountingMetricExporter`). Its last export, at shutdown, is not retried
    (`OtlpMetricReader`)."""
    otlp = otlp_metric_exporter(endpoint)
    exporter = otlp if counts is None else CountingMetricExporter(otlp, counts)
    return OtlpMetricReader(exporter, otlp, export_interval_millis=export_interval_s(interval_s) * 1000)


class OtlpMetricReader(PeriodicExportingMetricReader):
    """The SDK's periodic reader (`kwargs` are its own) over `exporter`, which sends through `otlp`
    (the SDK's OTLP exporter, itself or wrapped). At shutdown the last export is one attempt: a
    failure is not retried with back-off (`final_export.stop_retries`), so a process whose endpoint
    refuses connections stops at once instead of after the exporter's timeout."""

    def __init__(self, exporter: MetricExporter, otlp: MetricExporter, **kwargs):
        super().__init__(exporter, **kwargs)
        self._otlp = otlp

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        stop_retries(self._otlp)
        super().shutdown(timeout_millis=timeout_millis, **kwargs)


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
