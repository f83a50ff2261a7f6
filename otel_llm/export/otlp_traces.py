"""Which TracerProvider a Telemetry uses, from its config and the standard OTEL_* environment."""

from __future__ import annotations

import collections
import logging
import os
import time

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from otel_llm.export.export_counts import ExportCounts
from otel_llm.export.final_export import stop_retries
from otel_llm.export.otlp_endpoint import otlp_exporter

logger = logging.getLogger("otel_llm")

_WARNING_INTERVAL_S = 10.0  # between warnings about dropped spans


def otlp_span_exporter(endpoint: str | None):
    """An OTLP span exporter (see `otlp_endpoint.otlp_exporter`: protocol and endpoint, e.g.
    `--otlp-traces-endpoint`); over HTTP our `FastOTLPSpanExporter`, the SDK's with an encoder
    ~3.5x cheaper."""
    return otlp_exporter("traces", endpoint, _grpc_exporter, _http_exporter)


def _grpc_exporter() -> type:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter


def _http_exporter() -> type:
    from otel_llm.export.span_encoding import FastOTLPSpanExporter
    return FastOTLPSpanExporter


def end_spans(active, spans: list[ReadableSpan]) -> None:
    """Hand finished, sampled `spans` to a provider's span processors (`active`: its
    `_active_span_processor`) as their `on_end` one by one would, in order. A BatchSpanProcessor's
    (the SDK's, or counting) takes them into its queue in one call: its `on_end` per span (a sampled
    check, a getpid system call and three checks: ~0.8 us) was a quarter of a request's 4 spans' cost."""
    for processor in getattr(active, "_span_processors", None) or (active,):
        if type(processor) is CountingBatchSpanProcessor:
            processor.on_end_all(spans)
        elif type(processor) is not BatchSpanProcessor or not _queue_all(processor, spans):
            for span in spans:
                processor.on_end(span)


def _queue_all(processor: BatchSpanProcessor, spans: list[ReadableSpan]) -> bool:
    """Put `spans` on `processor`'s queue as its `on_end` would one by one, waking its worker at a
    full batch; False, having done nothing, where that would not be the same: an SDK before 1.34
    (a queue and worker of its own), a processor shut down or inherited across a fork (`on_end`
    restarts its worker), a queue without room for all (`on_end` drops and logs)."""
    try:
        batch = processor._batch_processor
        queue, wake, size = batch._queue, batch._worker_awaken, batch._max_export_batch_size
        if (type(queue) is not collections.deque or batch._shutdown or batch._pid != os.getpid()
                or len(queue) + len(spans) > queue.maxlen):
            return False
    except (AttributeError, TypeError):
        return False
    queue.extendleft(spans)  # as appendleft one by one: the SDK exports from the other end
    if len(queue) >= size and not wake.is_set():
        wake.set()
    return True


def batch_span_processor(exporter, counts: ExportCounts | None = None) -> BatchSpanProcessor:
    """A BatchSpanProcessor: 512-span batches (the SDK's default) at least every 0.5 s
    from a queue of 8192 spans, unless OTEL_BSP_* say otherwise; with `counts`, a
    `CountingBatchSpanProcessor` counting into them.

    The export runs on the processor's thread but holds the GIL while it encodes
    (~13 us per span with `FastOTLPSpanExporter`, ~45 us with the SDK's encoder), so a
    batch costs the event loop at most one switch interval (5 ms) at a time; each HTTP
    POST costs ~1.5 ms of Python whatever its size, which large batches amortise. The
    queue holds a burst of ~1600 requests' spans; beyond that spans are dropped.
    """
    kwargs = {}
    for env, key, value in (("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "max_export_batch_size", 512),
                            ("OTEL_BSP_SCHEDULE_DELAY", "schedule_delay_millis", 500),
                            ("OTEL_BSP_MAX_QUEUE_SIZE", "max_queue_size", 8192)):
        if env not in os.environ:
            kwargs[key] = value
    if counts is None:
        return BatchSpanProcessor(exporter, **kwargs)
    return CountingBatchSpanProcessor(exporter, counts, **kwargs)


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor (`kwargs` are its own), counting each sampled span it is
    given into `counts`: `sent` or `send_failed` with the batch it is exported in, or
    `enqueue_failed`; `counts` also reports the queue's length and capacity.

    At shutdown the queued spans are exported, each batch once, without retries.

    The SDK drops a span when its queue is full and only logs it. Here a span that finds the
    queue full (or comes after `shutdown`) is refused before it reaches the SDK, counted, and
    warned about at most every 10 s, as the Collector's sending queue does. The cost per
    queued span is one length check.

    Exact when spans end on one thread (the server's event loop): between the check and the
    SDK's append only the SDK's worker touches the queue, and it only takes from it. Spans
    ended on several threads at once can overfill the queue, and the SDK drops the excess
    uncounted.
    """

    def __init__(self, exporter: SpanExporter, counts: ExportCounts, **kwargs):
        super().__init__(_CountingSpanExporter(exporter, counts), **kwargs)
        self._otlp = exporter
        # The SDK's bounded deque: in its shared BatchProcessor since SDK 1.34, its own `queue` before.
        queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
        if queue is None:
            queue = getattr(self, "queue", None)
        if not isinstance(queue, collections.deque) or queue.maxlen is None:
            raise TypeError("otel_llm cannot find this opentelemetry-sdk's span queue to count spans "
                            "(looked where opentelemetry-sdk 1.28 to 1.45 keep it)")
        self._sdk_queue = queue
        self._limit = queue.maxlen  # 0 once shut down: the SDK would drop every later span
        self._counts = counts
        self._next_warning = 0.0  # monotonic s
        counts.watch_queue(queue.__len__, queue.maxlen)

    def on_end(self, span: ReadableSpan) -> None:
        if len(self._sdk_queue) < self._limit:
            super().on_end(span)
        elif span.context and span.context.trace_flags.sampled:  # the SDK queues sampled spans only
            self._counts.add(enqueue_failed=1)
            now = time.monotonic()
            if now >= self._next_warning:
                self._next_warning = now + _WARNING_INTERVAL_S
                logger.warning("otel_llm: span queue full (%d spans) or shut down: %d spans dropped so far",
                               self._sdk_queue.maxlen, self._counts.stats().enqueue_failed)

    def on_end_all(self, spans: list[ReadableSpan]) -> None:
        """`on_end` for each of `spans` (sampled): in one call while the queue has room for all."""
        if len(self._sdk_queue) + len(spans) > self._limit or not _queue_all(self, spans):
            for span in spans:
                self.on_end(span)

    def shutdown(self) -> None:
        """Refuses later spans, then exports what is queued, each batch once: a failure is not
        retried with back-off (`final_export.stop_retries`)."""
        self._limit = 0
        stop_retries(self._otlp)
        return super().shutdown()


class _CountingSpanExporter(SpanExporter):
    """`exporter`, counting each batch `sent` (SUCCESS) or `send_failed` (FAILURE, or it raised)."""

    def __init__(self, exporter: SpanExporter, counts: ExportCounts):
        self.exporter, self._counts = exporter, counts

    def export(self, spans) -> SpanExportResult:
        try:
            result = self.exporter.export(spans)
        except Exception:
            self._counts.add(send_failed=len(spans))
            raise  # the SDK's worker logs it
        if result is SpanExportResult.SUCCESS:
            self._counts.add(sent=len(spans))
        else:
            self._counts.add(send_failed=len(spans))
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


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
