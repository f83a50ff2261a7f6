"""The collector's traces pipeline: each received ExportTraceServiceRequest, checked once, to
every trace backend's exporter.

A request is parsed in full once (so a malformed one answers 400 / INVALID_ARGUMENT at the
receiver instead of failing at a backend later, merged with good ones) and its spans counted;
the exporters get the bytes as they came. Thread-safety: `consume` runs on the receivers'
request threads; exporters' `export` is thread-safe and never blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.otlp_codec import PayloadError
from collector.trace_exporter import TraceExporter


class TracePipeline:
    def __init__(self, exporters: Sequence[TraceExporter]) -> None:
        self.exporters = tuple(exporters)

    def consume(self, payload: bytes) -> int:
        """Hand ``payload`` to every exporter; returns its number of spans. Raises PayloadError(400)
        when it is not an ExportTraceServiceRequest."""
        try:
            request = ExportTraceServiceRequest.FromString(payload)
        except (DecodeError, RecursionError) as exc:
            raise PayloadError(400, f"malformed protobuf ExportTraceServiceRequest: {exc}") from None
        spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        if spans:
            for exporter in self.exporters:
                exporter.export(payload, spans)
        return spans
