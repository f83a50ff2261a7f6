"""Hand-built OTLP metric requests (real opentelemetry-proto classes) for collector tests."""

from __future__ import annotations

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
SEC = 1_000_000_000


def kvs(attrs: dict) -> list[KeyValue]:
    out = []
    for k, v in attrs.items():
        if isinstance(v, bool):
            value = AnyValue(bool_value=v)
        elif isinstance(v, int):
            value = AnyValue(int_value=v)
        elif isinstance(v, float):
            value = AnyValue(double_value=v)
        else:
            value = AnyValue(string_value=v)
        out.append(KeyValue(key=k, value=value))
    return out


def request(metrics: list[metrics_pb2.Metric], service: str = "app", instance: str = "i-1",
            scope: str = "test.scope", **resource) -> bytes:
    res = {"service.name": service, **({"service.instance.id": instance} if instance else {}), **resource}
    rm = metrics_pb2.ResourceMetrics(
        resource={"attributes": kvs(res)},
        scope_metrics=[metrics_pb2.ScopeMetrics(scope={"name": scope, "version": "1.0"}, metrics=metrics)])
    return ExportMetricsServiceRequest(resource_metrics=[rm]).SerializeToString()


def counter(name: str, value: float, attrs: dict | None = None, start: int = SEC, time: int = 2 * SEC,
            temporality=CUMULATIVE, unit: str = "", monotonic: bool = True, points: list | None = None):
    pts = points or [metrics_pb2.NumberDataPoint(attributes=kvs(attrs or {}), start_time_unix_nano=start,
                                                 time_unix_nano=time, as_double=value)]
    return metrics_pb2.Metric(name=name, unit=unit, description=f"{name} help",
                              sum=metrics_pb2.Sum(data_points=pts, aggregation_temporality=temporality,
                                                  is_monotonic=monotonic))


def gauge(name: str, value: float, attrs: dict | None = None, time: int = 2 * SEC, unit: str = ""):
    pt = metrics_pb2.NumberDataPoint(attributes=kvs(attrs or {}), time_unix_nano=time, as_double=value)
    return metrics_pb2.Metric(name=name, unit=unit, gauge=metrics_pb2.Gauge(data_points=[pt]))


def histogram(name: str, counts: list[int], bounds: list[float], total: float, attrs: dict | None = None,
              start: int = SEC, time: int = 2 * SEC, temporality=CUMULATIVE, unit: str = "s",
              exemplar: tuple[bytes, bytes, float] | None = None):
    pt = metrics_pb2.HistogramDataPoint(attributes=kvs(attrs or {}), start_time_unix_nano=start,
                                        time_unix_nano=time, count=sum(counts), sum=total,
                                        bucket_counts=counts, explicit_bounds=bounds)
    if exemplar is not None:
        trace_id, span_id, value = exemplar
        pt.exemplars.add(time_unix_nano=time, as_double=value, trace_id=trace_id, span_id=span_id)
    return metrics_pb2.Metric(name=name, unit=unit,
                              histogram=metrics_pb2.Histogram(data_points=[pt], aggregation_temporality=temporality))


def samples(text: str) -> dict[str, float]:
    """Exposition text -> {series (name and labels as written): value}; exemplars ignored."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.split(" # ")[0].rsplit(" ", 1)
            out[series] = float(value)
    return out
