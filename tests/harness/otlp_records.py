"""Flat, immutable records of decoded OTLP data, and the flattening itself.

An Export*ServiceRequest nests resource -> scope -> items; tests and the shim
want one record per span / metric / log record with its resource attached.
Ids are lowercase hex ("" when absent), times are epoch ns, attribute maps are
read-only (``MappingProxyType``; they compare equal to plain dicts), and
AnyValue becomes the Python value: str, bool, int, float, bytes, tuple
(array) or read-only mapping (kvlist).
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

Attributes = Mapping[str, Any]


class SpanEvent(NamedTuple):
    name: str
    time_ns: int
    attributes: Attributes


class SpanLink(NamedTuple):
    trace_id: str
    span_id: str
    attributes: Attributes


@dataclass(frozen=True)
class SpanRecord:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: str  # "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER", "UNSPECIFIED"
    start_time_ns: int
    end_time_ns: int
    attributes: Attributes
    events: tuple[SpanEvent, ...]
    links: tuple[SpanLink, ...]
    status_code: str  # "UNSET", "OK", "ERROR"
    status_message: str
    resource_attributes: Attributes
    scope_name: str


class Exemplar(NamedTuple):
    value: float | int
    time_ns: int
    trace_id: str
    span_id: str
    filtered_attributes: Attributes


@dataclass(frozen=True)
class DataPoint:
    """One point; fields that do not apply to the metric kind are None / ()."""

    attributes: Attributes
    start_time_ns: int
    time_ns: int
    value: float | int | None = None  # gauge, sum
    count: int | None = None  # histogram, exponential_histogram, summary
    sum: float | None = None
    min: float | None = None
    max: float | None = None
    bucket_counts: tuple[int, ...] = ()  # histogram: len(explicit_bounds) + 1
    explicit_bounds: tuple[float, ...] = ()
    quantiles: tuple[tuple[float, float], ...] = ()  # summary: (quantile, value)
    exemplars: tuple[Exemplar, ...] = ()


@dataclass(frozen=True)
class MetricRecord:
    name: str
    kind: str  # "gauge", "sum", "histogram", "exponential_histogram", "summary"
    unit: str
    description: str
    temporality: str | None  # "CUMULATIVE" / "DELTA" for sum and histograms
    is_monotonic: bool | None  # sum only
    points: tuple[DataPoint, ...]
    resource_attributes: Attributes
    scope_name: str


@dataclass(frozen=True)
class LogRecord:
    time_ns: int
    observed_time_ns: int
    severity_number: int
    severity_text: str
    body: Any
    attributes: Attributes
    trace_id: str
    span_id: str
    resource_attributes: Attributes
    scope_name: str


def _flatten(resource_items, scope_field: str, item_field: str, build) -> list:
    """One record per item of an Export*ServiceRequest: `build(item, resource attrs, scope name)`."""
    return [build(item, resource, scoped.scope.name)
            for res in resource_items
            for resource in (attributes(res.resource.attributes),)
            for scoped in getattr(res, scope_field)
            for item in getattr(scoped, item_field)]


def flatten_spans(request: ExportTraceServiceRequest) -> list[SpanRecord]:
    return _flatten(request.resource_spans, "scope_spans", "spans", _span)


def flatten_metrics(request: ExportMetricsServiceRequest) -> list[MetricRecord]:
    return _flatten(request.resource_metrics, "scope_metrics", "metrics", _metric)


def flatten_logs(request: ExportLogsServiceRequest) -> list[LogRecord]:
    return _flatten(request.resource_logs, "scope_logs", "log_records", _log)


def _log(log, resource: Attributes, scope: str) -> LogRecord:
    return LogRecord(
        time_ns=log.time_unix_nano,
        observed_time_ns=log.observed_time_unix_nano,
        severity_number=log.severity_number,
        severity_text=log.severity_text,
        body=any_value(log.body),
        attributes=attributes(log.attributes),
        trace_id=log.trace_id.hex(),
        span_id=log.span_id.hex(),
        resource_attributes=resource,
        scope_name=scope,
    )


def any_value(value: AnyValue) -> Any:
    field = value.WhichOneof("value")
    if field is None:
        return None
    if field == "array_value":
        return tuple(any_value(v) for v in value.array_value.values)
    if field == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, field)


def attributes(key_values: Iterable[KeyValue]) -> Attributes:
    return MappingProxyType({kv.key: any_value(kv.value) for kv in key_values})


def _enum_name(enum, value: int, prefix: str) -> str:
    """An OTLP enum value's name without its prefix; a value this proto version does not know (a newer
    sender's, valid on the wire as OTLP requires) is kept as its number, e.g. "999"."""
    try:
        return enum.Name(value).removeprefix(prefix)
    except ValueError:
        return str(value)


def _span(span: trace_pb2.Span, resource: Attributes, scope: str) -> SpanRecord:
    return SpanRecord(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        kind=_enum_name(trace_pb2.Span.SpanKind, span.kind, "SPAN_KIND_"),
        start_time_ns=span.start_time_unix_nano,
        end_time_ns=span.end_time_unix_nano,
        attributes=attributes(span.attributes),
        events=tuple(
            SpanEvent(e.name, e.time_unix_nano, attributes(e.attributes)) for e in span.events
        ),
        links=tuple(
            SpanLink(link.trace_id.hex(), link.span_id.hex(), attributes(link.attributes))
            for link in span.links
        ),
        status_code=_enum_name(trace_pb2.Status.StatusCode, span.status.code, "STATUS_CODE_"),
        status_message=span.status.message,
        resource_attributes=resource,
        scope_name=scope,
    )


def _metric(metric: metrics_pb2.Metric, resource: Attributes, scope: str) -> MetricRecord:
    kind = metric.WhichOneof("data") or ""
    data = getattr(metric, kind) if kind else None
    temporality = None
    if kind in ("sum", "histogram", "exponential_histogram"):
        temporality = _enum_name(metrics_pb2.AggregationTemporality, data.aggregation_temporality,
                                 "AGGREGATION_TEMPORALITY_")
    return MetricRecord(
        name=metric.name,
        kind=kind,
        unit=metric.unit,
        description=metric.description,
        temporality=temporality,
        is_monotonic=data.is_monotonic if kind == "sum" else None,
        points=tuple(_point(kind, p) for p in data.data_points) if data is not None else (),
        resource_attributes=resource,
        scope_name=scope,
    )


def _point(kind: str, point: Any) -> DataPoint:
    common = dict(
        attributes=attributes(point.attributes),
        start_time_ns=point.start_time_unix_nano,
        time_ns=point.time_unix_nano,
    )
    if kind in ("gauge", "sum"):
        field = point.WhichOneof("value")
        return DataPoint(
            **common,
            value=getattr(point, field) if field else None,
            exemplars=_exemplars(point.exemplars),
        )
    if kind == "summary":
        return DataPoint(
            **common,
            count=point.count,
            sum=point.sum,
            quantiles=tuple((q.quantile, q.value) for q in point.quantile_values),
        )
    # histogram and exponential_histogram; exponential buckets are not flattened.
    return DataPoint(
        **common,
        count=point.count,
        sum=point.sum if point.HasField("sum") else None,
        min=point.min if point.HasField("min") else None,
        max=point.max if point.HasField("max") else None,
        bucket_counts=tuple(point.bucket_counts) if kind == "histogram" else (),
        explicit_bounds=tuple(point.explicit_bounds) if kind == "histogram" else (),
        exemplars=_exemplars(point.exemplars),
    )


def _exemplars(exemplars: Iterable[metrics_pb2.Exemplar]) -> tuple[Exemplar, ...]:
    return tuple(
        Exemplar(
            value=getattr(e, e.WhichOneof("value")) if e.WhichOneof("value") else 0,
            time_ns=e.time_unix_nano,
            trace_id=e.trace_id.hex(),
            span_id=e.span_id.hex(),
            filtered_attributes=attributes(e.filtered_attributes),
        )
        for e in exemplars
    )
