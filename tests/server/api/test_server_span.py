"""The retroactive HTTP SERVER span: parentage, the identity handed to handlers, errors, sampling."""

import asyncio

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from otel_llm.server.api.tracing import ServerSpanMiddleware

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


async def item(request):
    return JSONResponse({"trace_headers": getattr(request.state, "trace_headers", None)})


async def boom(request):
    raise RuntimeError("handler broke")


async def metrics(request):
    return PlainTextResponse("# metrics\n")


def serve(*requests):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = Starlette(routes=[Route("/items/{id}", item, methods=["POST"]), Route("/boom", boom),
                            Route("/metrics", metrics)])
    app.add_middleware(ServerSpanMiddleware, tracer_provider=provider)

    async def go():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [await client.request(method, path, headers=headers) for method, path, headers in requests]

    return asyncio.run(go()), exporter.get_finished_spans()


def test_child_of_the_incoming_traceparent_and_parent_of_the_handlers_work():
    (resp,), (span,) = serve(("POST", "/items/7", {"traceparent": f"00-{TRACE_ID}-{PARENT}-01",
                                                   "tracestate": "vendor=v1"}))
    assert span.kind is SpanKind.SERVER and span.name == "POST /items/{id}"
    assert format(span.context.trace_id, "032x") == TRACE_ID and format(span.parent.span_id, "016x") == PARENT
    assert span.parent.is_remote and span.context.trace_state.get("vendor") == "v1"
    a = span.attributes
    assert a["http.response.status_code"] == 200 and a["http.route"] == "/items/{id}" and a["url.path"] == "/items/7"
    assert a["http.request.method"] == "POST" and span.status.status_code is StatusCode.UNSET
    assert span.end_time >= span.start_time > 0
    handed = resp.json()["trace_headers"]  # what the handler passes to RequestInfo.trace_headers
    assert handed == {"traceparent": f"00-{TRACE_ID}-{span.context.span_id:016x}-01", "tracestate": "vendor=v1"}


def test_without_traceparent_a_new_trace_per_request():
    _, spans = serve(("POST", "/items/1", {}), ("POST", "/items/2", {}))
    assert len(spans) == 2 and all(s.parent is None for s in spans)
    assert spans[0].context.trace_id != spans[1].context.trace_id


def test_a_failing_handler_gives_an_error_span_with_the_exception():
    (resp,), (span,) = serve(("GET", "/boom", {}))
    assert resp.status_code == 500
    assert span.status.status_code is StatusCode.ERROR and "handler broke" in span.status.description
    (event,) = span.events
    assert event.name == "exception" and event.attributes["exception.type"] == "RuntimeError"
    assert "handler broke" in event.attributes["exception.stacktrace"]


@pytest.mark.parametrize("path, headers", [
    ("/items/1", {"traceparent": f"00-{TRACE_ID}-{PARENT}-00"}),  # the caller did not sample
    ("/metrics", {}),  # scrapes and probes are not traced
])
def test_no_span(path, headers):
    (resp,), spans = serve(("POST" if path.startswith("/items") else "GET", path, headers))
    assert resp.status_code == 200 and spans == ()
    if path.startswith("/items"):  # the unsampled decision still reaches the handler (children stay unsampled)
        assert resp.json()["trace_headers"]["traceparent"].endswith("-00")


def test_span_names_are_route_templates_never_the_raw_path_or_method():
    """Per the HTTP semconv: `{method} {route}`, `{method}` when no route matched (404), `HTTP` for a
    method outside the standard set; so clients cannot mint span names."""
    requests = [("GET", f"/random/{i}/x{i * 7919}", {}) for i in range(50)]
    requests += [("GET", "/items/3", {}), ("PUT", "/items/4", {}), ("FROB", "/items/5", {}), ("FROB", "/nope", {})]
    responses, spans = serve(*requests)
    assert [r.status_code for r in responses[-4:]] == [405, 405, 405, 404]
    assert [s.name for s in spans[:50]] == ["GET"] * 50
    assert {s.attributes["url.path"] for s in spans[:50]} == {path for _, path, _ in requests[:50]}
    assert [s.name for s in spans[50:]] == ["GET /items/{id}", "PUT /items/{id}", "HTTP /items/{id}", "HTTP"]
    other = spans[-1].attributes
    assert other["http.request.method"] == "_OTHER" and other["http.request.method_original"] == "FROB"


def test_url_path_is_bounded(monkeypatch):
    (_,), (span,) = serve(("POST", "/items/" + "7" * 10_000, {}))
    assert span.attributes["url.path"] == ("/items/" + "7" * 10_000)[:4096]
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "20")
    (_,), (span,) = serve(("POST", "/items/" + "7" * 10_000, {}))
    assert span.attributes["url.path"] == "/items/7777777777777" and span.attributes["http.route"] == "/items/{id}"
