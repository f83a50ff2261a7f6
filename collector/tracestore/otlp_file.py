"""Traces from an OTLP/JSON file, stored as the collector would have stored them.

The file holds ``ExportTraceServiceRequest``s in OTLP/JSON (ids in hex, as the OTLP spec writes
them): one per line, as the OpenTelemetry Collector's ``file`` exporter writes, or one document
(pretty-printed or not). Each request goes through `PhaseSpans`, as on the collector's ingest, so
vLLM's `llm_request` spans get their derived `queue`, `prefill` and `decode` children, and into a
`TraceStore` (a temporary one, for `otel-llm timeline --otlp-json`), which then answers for the
file exactly as the collector's store would.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.collector.pdata import otlp_codec
from otel_llm.collector.processor.phase_spans import PhaseSpans
from otel_llm.collector.tracestore.store import TraceStore


class TraceFileError(ValueError):
    """The file cannot be read as OTLP/JSON traces; the message names the file and line."""


def load_traces(path: str | Path, store: TraceStore, on_request: Callable[[int, int], None] | None = None) -> None:
    """Adds every request in the file at ``path`` to ``store``, after `PhaseSpans` (so the store
    answers for the file as the collector's would); ``on_request(requests, spans)`` is called after
    each request (for progress). Raises OSError when it cannot be read, TraceFileError when it is
    not OTLP/JSON traces."""
    phases = PhaseSpans()
    num_requests = num_spans = 0
    for request in _requests(Path(path)):
        try:
            num_spans += store.add(phases.process(request.SerializeToString()))
        except ValueError as exc:
            raise TraceFileError(f"{path}: {exc}") from None
        num_requests += 1
        if on_request is not None:
            on_request(num_requests, num_spans)


def _requests(path: Path):
    with path.open("rb") as f:
        first = True
        for number, line in enumerate(f, 1):
            text = line.strip()
            if not text:
                continue
            try:
                yield otlp_codec.decode(text, otlp_codec.JSON, ExportTraceServiceRequest)
            except otlp_codec.PayloadError as exc:
                if not first or text.endswith(b"}") or not text.startswith(b"{"):
                    raise TraceFileError(f"{path}:{number}: {exc.reason}") from None
                break  # the first line opens a document that goes on: the file is one document
            first = False
        else:
            return
    try:
        yield otlp_codec.decode(path.read_bytes(), otlp_codec.JSON, ExportTraceServiceRequest)
    except otlp_codec.PayloadError as exc:
        raise TraceFileError(f"{path}: {exc.reason}") from None
