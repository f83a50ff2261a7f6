"""Prometheus remote-write 1.0 messages, and the encoder from `PrwSeries` to a request body.

The message classes (`WriteRequest`, `TimeSeries`, `Label`, `Sample`, `Exemplar`,
`MetricMetadata`, package ``prometheus``) are built at import time from a field
table here (`proto_classes`), into a private descriptor pool: no generated code, no
clash with another copy of the same messages in the default pool. Field numbers
are those of ``prometheus/prometheus: prompb/remote.proto, prompb/types.proto
@v2.42.0``; the native ``Histogram`` (TimeSeries field 4) is left out, as we
never send it (a decoder keeps it as an unknown field).

A body is the serialized `WriteRequest`, snappy **block** compressed (the
remote-write 1.0 spec forbids the framed format).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

import cramjam

from otel_llm.collector.pdata.proto_classes import message_classes

STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
"""The staleness marker: a NaN whose bits are 0x7ff0000000000002 (send it when a series ends)."""


class PrwExemplar(NamedTuple):
    labels: tuple[tuple[str, str], ...]  # e.g. (("span_id", 16 hex), ("trace_id", 32 hex))
    value: float
    timestamp_ms: int  # since the epoch; 0 means "none" to Prometheus


class PrwSeries(NamedTuple):
    """One sample of one series. ``labels`` include ``("__name__", name)``, are sorted by
    name in byte order and have no empty values; the encoder sends them as they are."""

    labels: tuple[tuple[str, str], ...]
    value: float
    timestamp_ms: int  # since the epoch
    exemplar: PrwExemplar | None = None


# message -> (field, number, repeated, type); numbers from prompb (module docstring).
_MESSAGES = {
    "WriteRequest": [("timeseries", 1, True, "TimeSeries"), ("metadata", 3, True, "MetricMetadata")],  # 2: Cortex
    "TimeSeries": [("labels", 1, True, "Label"), ("samples", 2, True, "Sample"), ("exemplars", 3, True, "Exemplar")],
    "Label": [("name", 1, False, "string"), ("value", 2, False, "string")],
    "Sample": [("value", 1, False, "double"), ("timestamp", 2, False, "int64")],
    "Exemplar": [("labels", 1, True, "Label"), ("value", 2, False, "double"), ("timestamp", 3, False, "int64")],
    "MetricMetadata": [("type", 1, False, "MetricMetadata.MetricType"), ("metric_family_name", 2, False, "string"),
                       ("help", 4, False, "string"), ("unit", 5, False, "string")],
}
_ENUMS = {"MetricMetadata.MetricType": ("UNKNOWN", "COUNTER", "GAUGE", "HISTOGRAM", "GAUGEHISTOGRAM", "SUMMARY",
                                        "INFO", "STATESET")}
_CLASSES = message_classes("prometheus", _MESSAGES, enums=_ENUMS)
WriteRequest, TimeSeries, Label, Sample, Exemplar, MetricMetadata = (
    _CLASSES[name] for name in ("WriteRequest", "TimeSeries", "Label", "Sample", "Exemplar", "MetricMetadata"))


def write_request(series: Iterable[PrwSeries]) -> WriteRequest:
    """One TimeSeries per `PrwSeries`, with its one sample and its exemplar if any."""
    # Appending through the repeated fields' add() is ~2.4x faster here (upb) than
    # constructing child messages by keyword and passing lists (measured on 10,000 series).
    request = WriteRequest()
    add_timeseries = request.timeseries.add
    for s in series:
        ts = add_timeseries()
        add_label = ts.labels.add
        for name, value in s.labels:
            add_label(name=name, value=value)
        ts.samples.add(value=s.value, timestamp=s.timestamp_ms)
        e = s.exemplar
        if e is not None:
            add_label = ts.exemplars.add(value=e.value, timestamp=e.timestamp_ms).labels.add
            for name, value in e.labels:
                add_label(name=name, value=value)
    return request


def encode_write_request(series: Iterable[PrwSeries]) -> bytes:
    """The remote-write body for ``series``: serialized WriteRequest, snappy block compressed."""
    return bytes(cramjam.snappy.compress_raw(write_request(series).SerializeToString()))


def decode_write_request(body: bytes) -> WriteRequest:
    """Inverse of `encode_write_request` (for tests and debugging). Raises on a malformed body."""
    request = WriteRequest()
    request.ParseFromString(bytes(cramjam.snappy.decompress_raw(body)))
    return request


__all__ = [
    "STALE_NAN",
    "Exemplar",
    "Label",
    "MetricMetadata",
    "PrwExemplar",
    "PrwSeries",
    "Sample",
    "TimeSeries",
    "WriteRequest",
    "decode_write_request",
    "encode_write_request",
]
