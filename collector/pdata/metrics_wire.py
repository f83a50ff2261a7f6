"""A wire-compatible view of ExportMetricsServiceRequest built for fast ingestion.

The generated OTLP classes make every attribute a nested message: reading one
data point's five attributes costs ~4 us in Python (measured here), more than
the rest of its ingestion. This view declares the same field numbers with the
same wire types, but keeps what ingestion only needs as an identity as raw
bytes:

- `Resource`, `InstrumentationScope` and each attribute `KeyValue` stay
  serialized (`bytes`), so a series key is `tuple(point.attributes[:])`: one C
  call. They are decoded (with the real classes, `decode_*` below) only when a
  new series or resource appears.
- `bucket_counts` and `explicit_bounds` are packed repeated fields (wire type 2,
  as every OTel SDK writes them), read as `bytes`; `np.frombuffer` turns them
  into arrays without a Python int per bucket. A sender that writes them
  unpacked (legal, never seen) lands in unknown fields: `histogram_arrays`
  falls back to the real class for that point.

Only metrics are viewed this way; proto2 syntax gives every scalar presence
(`HasField`), which is wire-identical to proto3's implicit presence.
"""

from __future__ import annotations

import numpy as np
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_llm.collector.pdata.proto_classes import message_classes

_ONE, _MANY = False, True  # repeated?

# message -> (field, number, repeated, type[, oneof]); numbers from opentelemetry-proto metrics/v1.
_MESSAGES = {
    "ExportMetricsServiceRequest": [("resource_metrics", 1, _MANY, "ResourceMetrics")],
    "ResourceMetrics": [("resource", 1, _ONE, "bytes"), ("scope_metrics", 2, _MANY, "ScopeMetrics")],
    "ScopeMetrics": [("scope", 1, _ONE, "bytes"), ("metrics", 2, _MANY, "Metric")],
    "Metric": [("name", 1, _ONE, "string"), ("description", 2, _ONE, "string"), ("unit", 3, _ONE, "string"),
               ("gauge", 5, _ONE, "Gauge", "data"), ("sum", 7, _ONE, "Sum", "data"),
               ("histogram", 9, _ONE, "Histogram", "data"),
               ("exponential_histogram", 10, _ONE, "Unsupported", "data"),
               ("summary", 11, _ONE, "Unsupported", "data")],
    "Unsupported": [("data_points", 1, _MANY, "bytes")],
    "Gauge": [("data_points", 1, _MANY, "NumberDataPoint")],
    "Sum": [("data_points", 1, _MANY, "NumberDataPoint"), ("aggregation_temporality", 2, _ONE, "int32"),
            ("is_monotonic", 3, _ONE, "bool")],
    "Histogram": [("data_points", 1, _MANY, "HistogramDataPoint"), ("aggregation_temporality", 2, _ONE, "int32")],
    "NumberDataPoint": [("attributes", 7, _MANY, "bytes"), ("start_time_unix_nano", 2, _ONE, "fixed64"),
                        ("time_unix_nano", 3, _ONE, "fixed64"), ("as_double", 4, _ONE, "double", "value"),
                        ("as_int", 6, _ONE, "sfixed64", "value"), ("exemplars", 5, _MANY, "Exemplar"),
                        ("flags", 8, _ONE, "uint32")],
    "HistogramDataPoint": [("attributes", 9, _MANY, "bytes"), ("start_time_unix_nano", 2, _ONE, "fixed64"),
                           ("time_unix_nano", 3, _ONE, "fixed64"), ("count", 4, _ONE, "fixed64"),
                           ("sum", 5, _ONE, "double"), ("bucket_counts", 6, _ONE, "bytes"),
                           ("explicit_bounds", 7, _ONE, "bytes"), ("exemplars", 8, _MANY, "Exemplar"),
                           ("flags", 10, _ONE, "uint32"), ("min", 11, _ONE, "double"), ("max", 12, _ONE, "double")],
    "Exemplar": [("filtered_attributes", 7, _MANY, "bytes"), ("time_unix_nano", 2, _ONE, "fixed64"),
                 ("as_double", 3, _ONE, "double", "value"), ("as_int", 6, _ONE, "sfixed64", "value"),
                 ("span_id", 4, _ONE, "bytes"), ("trace_id", 5, _ONE, "bytes")],
}

# AggregationTemporality and DataPointFlags values of the OTLP proto.
DELTA, CUMULATIVE = 1, 2
FLAG_NO_RECORDED_VALUE = 1


_CLASSES = message_classes("otel_llm.collector.wire", _MESSAGES, syntax="proto2")
ExportMetricsServiceRequest = _CLASSES["ExportMetricsServiceRequest"]


def number_value(point) -> float:
    """A NumberDataPoint's or Exemplar's value (as_double or as_int; 0 when neither is set)."""
    return point.as_double if point.HasField("as_double") else float(point.as_int)


def histogram_arrays(point) -> tuple[np.ndarray, np.ndarray]:
    """(bucket_counts uint64, explicit_bounds float64) of a HistogramDataPoint view."""
    counts = np.frombuffer(point.bucket_counts, "<u8")
    bounds = np.frombuffer(point.explicit_bounds, "<f8")
    if (not counts.size and point.count) or (counts.size and counts.size != bounds.size + 1):
        # Unpacked encoding (kept as unknown fields): read this point with the real class.
        real = metrics_pb2.HistogramDataPoint.FromString(point.SerializeToString())
        counts = np.array(real.bucket_counts, np.uint64)
        bounds = np.array(real.explicit_bounds, np.float64)
    return counts, bounds


def decode_resource(raw: bytes) -> Resource:
    return Resource.FromString(raw)


def decode_scope(raw: bytes) -> InstrumentationScope:
    return InstrumentationScope.FromString(raw)


def decode_key_values(raws) -> list[KeyValue]:
    return [KeyValue.FromString(raw) for raw in raws]
