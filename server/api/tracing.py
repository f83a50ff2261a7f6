"""HTTP SERVER spans and the process's `TracerProvider`.

`ServerSpanMiddleware` is a pure ASGI middleware: one SERVER span per HTTP
request, a child of the incoming W3C `traceparent` (if any), current while the
handler runs and open until the last body byte is sent (so a streamed response
is inside its span). Handlers inject the current context into the telemetry
SDK's `trace_headers`, which makes the SDK's gen_ai span a child of this one.
Scrape and probe paths (`/metrics`, health) get no span.
"""

from __future__ import annotations

import logging

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
_UNTRACED_PREFIXES = ("/metrics", "/health", "/v2/health", "/ping")


def build_tracer_provider(service_name: str, otlp_traces_endpoint: str | None) -> TracerProvider:
    """A provider with an OTLP exporter when an endpoint is given, else none (spans
    are still created, so trace ids propagate, but go nowhere).

    The exporter is the SDK's (`otel_llm.tracer_setup.otlp_span_exporter`): OTLP/HTTP
    unless `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL=grpc`; `/v1/traces` is appended to an
    HTTP endpoint that lacks it. `OTEL_SERVICE_NAME` wins over `service_name`.
    """
    resource = Resource.create()
    if resource.attributes.get("service.name", "unknown_service").startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": service_name}))
    provider = TracerProvider(resource=resource)
    if otlp_traces_endpoint:
        from otel_llm.tracer_setup import batch_span_processor, otlp_span_exporter

        provider.add_span_processor(batch_span_processor(otlp_span_exporter(otlp_traces_endpoint)))
        logger.info("exporting traces over OTLP to %s", otlp_traces_endpoint)
    return provider


class ServerSpanMiddleware:
    def __init__(self, app, tracer_provider: TracerProvider):
        self.app = app
        self.tracer = tracer_provider.get_tracer("otel_llm.server")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(_UNTRACED_PREFIXES):
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate")}
        method = scope["method"]
        attributes = {
            "http.request.method": method,
            "url.path": scope["path"],
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        if scope.get("client"):
            attributes["client.address"] = scope["client"][0]
        with self.tracer.start_as_current_span(
            f"{method} {scope['path']}", context=_PROPAGATOR.extract(carrier), kind=SpanKind.SERVER,
            attributes=attributes, record_exception=True, set_status_on_exception=True,
        ) as span:
            def send_with_status(message):  # a plain function: no extra coroutine per streamed chunk
                if message["type"] == "http.response.start":
                    status = message["status"]
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                return send(message)

            await self.app(scope, receive, send_with_status)
            route = scope.get("route")
            if route is not None and getattr(route, "path", None):
                span.set_attribute("http.route", route.path)
                span.update_name(f"{method} {route.path}")


def current_trace_headers() -> dict[str, str]:
    """The current span's context as W3C headers (empty when there is none)."""
    carrier: dict[str, str] = {}
    if trace.get_current_span().get_span_context().is_valid:
        _PROPAGATOR.inject(carrier)
    return carrier
