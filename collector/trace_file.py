"""Traces from an OTLP/JSON file, read as the collector would have stored them.

The file holds ``ExportTraceServiceRequest``s in OTLP/JSON (ids in hex, as the OTLP spec writes
them): one per line, as the OpenTelemetry Collector's ``file`` exporter writes, or one document
(pretty-printed or not). Each request goes through `PhaseSpans`, as on the collector's ingest, so
vLLM's `llm_request` spans get their derived `queue`, `prefill` and `decode` children. Spans come
out grouped by trace, each trace in the trace store's order (start in µs, then file order), so a
trace reads the same as the collector's store would give it back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector import otlp_codec
from collector.phase_spans import PhaseSpans
from collector.request_span import request_facts
from collector.trace_query import StoredSpan


class TraceFileError(ValueError):
    """The file cannot be read as OTLP/JSON traces; the message names the file and line."""


def read_traces(path: str | Path, on_request: Callable[[int, int], None] | None = None) -> list[list[StoredSpan]]:
    """Every trace in the file at ``path``; ``on_request(requests, spans)`` is called after each
    request read (for progress). Raises OSError when it cannot be read, TraceFileError when it is
    not OTLP/JSON traces."""
    phases = PhaseSpans()
    traces: dict[bytes, list[StoredSpan]] = {}
    num_requests = num_spans = 0
    for request in _requests(Path(path)):
        payload = request.SerializeToString()
        derived = phases.process(payload)
        if derived is not payload:
            request = ExportTraceServiceRequest.FromString(derived)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    traces.setdefault(span.trace_id, []).append(StoredSpan(span, rs.resource, ss.scope))
                    num_spans += 1
        num_requests += 1
        if on_request is not None:
            on_request(num_requests, num_spans)
    return [sorted(spans, key=lambda s: s.span.start_time_unix_nano // 1000) for spans in traces.values()]


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


def request_traces(traces: list[list[StoredSpan]], start_us: int, end_us: int, limit: int) -> list[list[StoredSpan]]:
    """`TraceStore.request_traces`' choice among ``traces``: those with a request span (one with
    ``gen_ai.latency.*``) that started in [start_us, end_us], by their first such start, at most
    ``limit``."""
    chosen = []
    for spans in traces:
        starts = [us for us in (s.span.start_time_unix_nano // 1000 for s in spans if request_facts(s.span).is_request)
                  if start_us <= us <= end_us]
        if starts:
            chosen.append((min(starts), spans))
    chosen.sort(key=lambda pair: pair[0])
    return [spans for _, spans in chosen[:limit]]
