"""HTTP SERVER spans and the process's `TracerProvider`.

`ServerSpanMiddleware` is a pure ASGI middleware: one SERVER span per HTTP
request, a child of the incoming W3C `traceparent` (if any), from when the server
read the request (`server.api.arrival`'s stamp, the gen_ai span's start too) until
the last body byte is sent (so a streamed response is inside it), on the one clock
of `otel_llm.engine.clock`.
Like the SDK's gen_ai spans (`otel_llm.frontend.request_spans`), it is built retroactively: the
span's identity is decided up front and put in `scope["state"]["trace_headers"]`
(handlers pass it to `RequestInfo.trace_headers`, which makes the gen_ai span its
child), and the finished span goes straight to the provider's span processors:
no live span, no context attach per request. Scrape and probe paths (`/metrics`,
health) get no span.

With `--return-timings` (`traceresponse=True`), or for a request whose handler set
`scope["state"]["return_timings"]` (a body asking for `return_timings`), the response carries the W3C
`traceresponse` header (Trace Context Level 2: `00-{trace id}-{this span's id}-01`), so the client can
open its trace; a handler's `return_timings: false` leaves it out.

Per the HTTP semantic conventions the span is named `{method} {route template}`, or
just `{method}` when no route matched (a 404), so clients cannot mint span names;
a method outside the standard set is `_OTHER` (span name `HTTP`). The provider's
span limits apply (`otel_llm.frontend.span_limits`: `url.path` is cut at 4096 characters by default).
"""

from __future__ import annotations

import logging
import traceback

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_llm.engine.clock import epoch_ns, now_epoch_ns
from otel_llm.export.export_counts import ExportCounts
from otel_llm.export.redaction import redact_url
from otel_llm.frontend.request_spans import new_span_identity
from otel_llm.frontend.span_limits import SpanLimiter

logger = logging.getLogger(__name__)

_UNTRACED_PREFIXES = ("/metrics", "/health", "/v2/health", "/ping")
_SCOPE = InstrumentationScope("otel_llm.server")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_METHODS = frozenset(("CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE"))


def build_tracer_provider(resource: Resource, otlp_traces_endpoint: str | None,
                          counts: ExportCounts | None = None) -> TracerProvider:
    """A provider with an OTLP exporter when an endpoint is given, else none (spans
    are still created, so trace ids propagate, but go nowhere); its spans are counted
    into `counts` (`otel_llm.export.otlp_traces.CountingBatchSpanProcessor`) if given.

    The exporter is the SDK's (`otel_llm.export.otlp_traces.otlp_span_exporter`): OTLP/HTTP
    unless `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL=grpc`; `/v1/traces` is appended to an
    HTTP endpoint that lacks it.
    """
    provider = TracerProvider(resource=resource)
    if otlp_traces_endpoint:
        from otel_llm.export.otlp_traces import batch_span_processor, otlp_span_exporter

        provider.add_span_processor(batch_span_processor(otlp_span_exporter(otlp_traces_endpoint), counts))
        logger.info("exporting traces over OTLP to %s", redact_url(otlp_traces_endpoint))
    return provider


class ServerSpanMiddleware:
    def __init__(self, app, tracer_provider: TracerProvider, traceresponse: bool = False):
        self.app = app
        self.traceresponse = traceresponse
        self.provider = tracer_provider
        self._processor = tracer_provider._active_span_processor  # as otel_llm.frontend.request_spans does
        self._limits = SpanLimiter(tracer_provider._span_limits)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(_UNTRACED_PREFIXES):
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate")}
        method = scope["method"] if scope["method"] in _METHODS else "_OTHER"
        name = "HTTP" if method == "_OTHER" else method  # `{name} {route}` once a route matched
        trace_id, span_id, parent, sampled = new_span_identity(self.provider, carrier, name, SpanKind.SERVER)
        headers = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"}
        if parent is not None and parent.trace_state:
            headers["tracestate"] = parent.trace_state.to_header()
        scope.setdefault("state", {})["trace_headers"] = headers
        if not sampled:
            await self.app(scope, receive, send)
            return
        # from when the server read the request (`server.api.arrival`, as the gen_ai span under it), else now;
        # on the one clock of the spans under it (otel_llm.engine.clock)
        arrival = scope["state"].get("arrival_ns")
        start = now_epoch_ns() if arrival is None else epoch_ns(arrival)
        attributes = {
            "http.request.method": method,
            "url.path": scope["path"],
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        if method == "_OTHER":
            attributes["http.request.method_original"] = scope["method"]
        if scope.get("client"):
            attributes["client.address"] = scope["client"][0]
        status, events = Status(StatusCode.UNSET), ()

        def send_with_status(message):  # a plain function: no extra coroutine per streamed chunk
            nonlocal status
            if message["type"] == "http.response.start":
                attributes["http.response.status_code"] = code = message["status"]
                if code >= 500:
                    status = Status(StatusCode.ERROR)
                if scope["state"].get("return_timings", self.traceresponse):
                    message = {**message, "headers": [*message.get("headers", ()),
                                                      (b"traceresponse", f"00-{trace_id:032x}-{span_id:016x}-01".encode())]}
            return send(message)

        try:
            await self.app(scope, receive, send_with_status)
        except BaseException as exc:
            status = Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
            events = (Event("exception", {"exception.type": type(exc).__qualname__, "exception.message": str(exc),
                                          "exception.stacktrace": "".join(traceback.format_exception(exc)),
                                          "exception.escaped": True}),)
            raise
        finally:
            route = getattr(scope.get("route"), "path", None)  # the template: set only when a route matched
            if route:
                attributes["http.route"] = route
            ctx = SpanContext(trace_id, span_id, False, _SAMPLED, parent.trace_state if parent else None)
            self._processor.on_end(ReadableSpan(
                f"{name} {route}" if route else name, ctx, parent, self.provider.resource,
                self._limits.attributes(attributes), self._limits.events(events), (),
                SpanKind.SERVER, None, status, start, now_epoch_ns(), _SCOPE))
