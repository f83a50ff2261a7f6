"""`HttpMetrics`: the families vLLM's `/metrics` has besides `vllm:*`, from the same libraries.

vLLM's API server (`vllm/entrypoints/serve/instrumentator/metrics.py`) instruments its app with
prometheus-fastapi-instrumentator:

    Instrumentator(excluded_handlers=["/metrics", "/health", "/load", "/ping", "/version", "/server_info"],
                   registry=registry).add().instrument(app).expose(app, response_class=PrometheusResponse)

`.add()` with no function leaves the middleware to install `metrics.default()`: `http_requests_total
{method,status,handler}` (status grouped to 2xx/4xx/5xx), the summaries `http_request_size_bytes{handler}`
and `http_response_size_bytes{handler}` (the Content-Length headers; 0 for a stream),
`http_request_duration_highr_seconds` (no labels, 0.01 .. 60 s) and `http_request_duration_seconds
{method,handler}` (0.1, 0.5, 1 s); durations run to the end of the response body, streams included.
In single-process mode vLLM's registry is prometheus_client's global REGISTRY, so the default
`process_*` and `python_*` collectors are in the same exposition.

Here: the same Instrumentator with the same options, but on a registry of this app's own holding
`ProcessCollector`, `PlatformCollector` and `GCCollector` too (the global REGISTRY would make two
apps in one process, as in tests, collide), rendered by prometheus_client in the format `/metrics`
negotiated and appended to the SDK's families (`make_metrics_app(extra=...)`). No `.expose()`:
`/metrics` is the SDK's endpoint. The excluded handlers are regular expressions found anywhere in
the route template (`re.search`), so `/health` also excludes `/v2/health/live` and `/v2/health/ready`,
as it would in vLLM; a path no route matches is counted under handler `none`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.applications import Starlette

EXCLUDED_HANDLERS = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")  # vLLM's list
_EOF = b"# EOF\n"


class HttpMetrics:
    """One app's prometheus_client registry: the instrumentator's families (created when the app
    builds its middleware stack, at the lifespan's start) and the process, platform and gc
    collectors. prometheus_client locks its own metrics: `render` may run in any thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        self._instrumentator = Instrumentator(excluded_handlers=list(EXCLUDED_HANDLERS),
                                              registry=self.registry).add()

    def instrument(self, app: Starlette) -> None:
        """Add the instrumentator's middleware (before the app starts: Starlette refuses it after).
        It counts what the middleware inside it answers, so add it after those whose answers
        (413 from `BodyLimit`) should count."""
        self._instrumentator.instrument(app)

    def render(self, openmetrics: bool, compat: str | None = None) -> bytes:
        """The registry's families in text format 0.0.4, or OpenMetrics 1.0 without its `# EOF`
        (the exposition they are appended to ends with the one `# EOF`); vLLM's names under every `compat`."""
        if openmetrics:
            return generate_openmetrics(self.registry).removesuffix(_EOF)
        return generate_latest(self.registry)
