"""`--trace-store`: a real server's request spans through the collector into the store, read back over
Jaeger's query API the way Grafana and the Jaeger UI ask, and the LLM questions answered: the
slowest requests, the aborted ones, and the trace behind an exemplar on the server's /metrics; a span
delivered again (OTLP is at least once) stored and served once."""

from __future__ import annotations

import re
import time

import grpc
import httpx
import pytest
from openai import OpenAI
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.collector.tracestore.store import TraceStoreConfig
from tests.collector.otlp_builders import samples
from tests.collector.tracestore.test_store import llm_spans, request, tid
from tests.server.api.api_server_harness import ServerProcess, wait_until


def get(api: str, path: str, **params) -> dict:
    answer = httpx.get(f"{api}{path}", params=params, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.slow
def requests(traces: list[dict]) -> list[dict]:
    """The traces of requests (not the engine lane's `engine steps` windows, traces of their own)."""
    return [t for t in traces if not any(s["operationName"] == "engine steps" for s in t["spans"])]


def test_real_server_traces_are_stored_and_served_as_jaeger_does(tmp_path):
    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(tmp_path / "traces")))
    with Collector(config) as collector:
        api = collector.jaeger.url
        server = ServerProcess("--otlp-traces-endpoint", f"{collector.http.endpoint}/v1/traces",
                               env={"OTEL_BSP_SCHEDULE_DELAY": "100"}).start()
        try:
            client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
            for i in range(3):
                client.chat.completions.create(model="dummy", max_tokens=8,
                                               messages=[{"role": "user", "content": f"question {i}"}])
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30, json={
                    "model": "dummy", "prompt": "long", "max_tokens": 2000, "ignore_eos": True, "stream": True}) as r:
                next(r.iter_lines())  # the first token, then the client goes away: the server aborts it
            openmetrics = httpx.get(f"{server.url}/metrics", timeout=10,
                                    headers={"Accept": "application/openmetrics-text; version=1.0.0"}).text
            assert wait_until(lambda: len(requests(get(api, "/api/traces", service="otel-llm")["data"])) == 4
                              and get(api, "/api/llm/failed")["data"], timeout_s=20)
        finally:
            server.stop()

        assert "otel-llm" in get(api, "/api/services")["data"]
        operations = set(get(api, "/api/services/otel-llm/operations")["data"])
        assert {"chat dummy", "text_completion dummy", "queue", "prefill", "decode", "engine steps"} <= operations
        chat = get(api, "/api/traces", service="otel-llm", operation="chat dummy", limit=10)["data"]
        assert len(chat) == 3
        for trace in chat:
            names = {s["operationName"] for s in trace["spans"]}
            assert {"chat dummy", "queue", "prefill", "decode"} <= names
            root = next(s for s in trace["spans"] if s["operationName"] == "chat dummy")
            children = [s for s in trace["spans"] if s["operationName"] in ("queue", "prefill", "decode")]
            assert all(c["references"][0] == {"refType": "CHILD_OF", "traceID": trace["traceID"],
                                              "spanID": root["spanID"]} for c in children)
            tags = {t["key"]: t["value"] for t in root["tags"]}
            assert tags["gen_ai.request.model"] == "dummy" and tags["span.kind"] in ("server", "internal")
            assert trace["processes"][root["processID"]]["serviceName"] == "otel-llm"

        failed = get(api, "/api/llm/failed")["data"]
        assert [(r["operation"], r["errorType"]) for r in failed] == [("text_completion dummy", "abort")]
        slowest = get(api, "/api/llm/slowest", metric="ttft", lookback="5m", limit=20)["data"]
        assert len(slowest) == 4 and [r["ttftSeconds"] for r in slowest] == sorted(
            (r["ttftSeconds"] for r in slowest), reverse=True)

        # an exemplar on the server's own /metrics leads to its trace
        trace_ids = re.findall(r'^vllm:e2e_request_latency_seconds_bucket\{.*\} \S+ # \{trace_id="([0-9a-f]{32})"',
                               openmetrics, re.M)
        assert trace_ids
        found = get(api, f"/api/traces/{trace_ids[0]}")["data"]
        jaeger_id = trace_ids[0][16:] if trace_ids[0].startswith("0" * 16) else trace_ids[0]  # Jaeger's short form
        assert len(found) == 1 and found[0]["traceID"] == jaeger_id
        assert any(s["operationName"] in ("chat dummy", "text_completion dummy") for s in found[0]["spans"])
        stats = collector.render().decode()
        assert re.search(r'^otelcol_exporter_sent_spans_total\{exporter="tracestore",data_type="traces"\} [1-9]',
                         stats, re.M)


def test_a_span_delivered_again_is_stored_and_served_once(tmp_path):
    """OTLP delivery is at least once: a client's retry, the on-disk queue's resend after a restart."""
    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(tmp_path)))
    spans = llm_spans(1, time.time_ns() - 10**9)
    once, twice = request(spans), request(spans + spans)  # the second: the same spans twice in one request
    with Collector(config) as collector:
        api = collector.jaeger.url
        for body in [once] * 20 + [twice]:
            answer = httpx.post(f"{collector.http.endpoint}/v1/traces", content=body.SerializeToString(),
                                headers={"Content-Type": "application/x-protobuf"}, timeout=10)
            assert answer.status_code == 200
        with grpc.insecure_channel(collector.grpc.endpoint) as channel:
            channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                request_serializer=ExportTraceServiceRequest.SerializeToString)(once, timeout=10)
        sent = 'otelcol_exporter_sent_spans_total{exporter="tracestore",data_type="traces"}'
        assert wait_until(lambda: samples(collector.render().decode())[sent] == 5 * 23, timeout_s=10)

        traces = get(api, f"/api/traces/{tid(1).hex()}")["data"]
        assert len(traces) == 1 and sorted(s["spanID"] for s in traces[0]["spans"]) == sorted(s.span_id.hex() for s in spans)
        found = get(api, "/api/traces", service="llm")["data"]
        assert len(found) == 1 and len(found[0]["spans"]) == 5
        timeline = get(api, "/api/llm/timeline")
        assert timeline["total"] == timeline["data"]["requests"] == len(timeline["data"]["rows"]) == 1
        assert len(get(api, "/api/llm/slowest", metric="ttft")["data"]) == 1


@pytest.mark.slow
def test_calls_across_three_services_are_the_dependencies_jaegers_ui_draws(tmp_path):
    """An app calls a gateway, the gateway calls a real `otel-llm serve` (W3C traceparent over HTTP):
    each process exports its own spans (the real OTel SDK; the server its own), and the collector's
    `/api/dependencies` (System Architecture) and v3 search (the trace's services) see the calls."""
    from opentelemetry import propagate, trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(tmp_path)))
    with Collector(config) as collector:
        api, endpoint = collector.jaeger.url, f"{collector.http.endpoint}/v1/traces"
        server = ServerProcess("--otlp-traces-endpoint", endpoint, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}).start()
        providers = {name: TracerProvider(resource=Resource({"service.name": name})) for name in ("app", "gateway")}
        for provider in providers.values():
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=100))
        app, gateway = (providers[n].get_tracer("test") for n in ("app", "gateway"))
        try:
            for i in range(3):
                with app.start_as_current_span("ask", kind=trace.SpanKind.CLIENT):
                    carrier: dict[str, str] = {}
                    propagate.inject(carrier)
                with gateway.start_as_current_span("POST /chat", kind=trace.SpanKind.SERVER,
                                                   context=propagate.extract(carrier)):
                    with gateway.start_as_current_span("POST upstream", kind=trace.SpanKind.CLIENT):
                        headers: dict[str, str] = {}
                        propagate.inject(headers)
                        answer = httpx.post(f"{server.url}/v1/completions", headers=headers, timeout=30,
                                            json={"model": "dummy", "prompt": f"q{i}", "max_tokens": 4})
                        assert answer.status_code == 200
            for provider in providers.values():
                provider.force_flush()
            want = [{"parent": "app", "child": "gateway", "callCount": 3},
                    {"parent": "gateway", "child": "otel-llm", "callCount": 3}]
            now_ms = time.time_ns() // 1_000_000
            assert wait_until(lambda: sorted(get(api, "/api/dependencies", endTs=now_ms + 60_000,
                                                 lookback=600_000)["data"], key=str) == want, timeout_s=20), \
                get(api, "/api/dependencies", endTs=now_ms + 60_000, lookback=600_000)
        finally:
            server.stop()
            for provider in providers.values():
                provider.shutdown()
        start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))
        end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
        summaries = get(api, "/api/v3/trace-summaries", **{"query.serviceName": "gateway", "query.startTimeMin": start,
                                                           "query.startTimeMax": end})["summaries"]
        assert len(summaries) == 3
        for s in summaries:
            assert [x["name"] for x in s["services"]] == ["app", "gateway", "otel-llm"]
            assert (s["rootServiceName"], s["rootOperationName"]) == ("app", "ask") and "orphanSpanCount" not in s


@pytest.mark.slow
def test_under_load_every_child_span_lies_within_its_parent_and_first_token_is_where_ttft_says(tmp_path):
    """A real server (its engine in its own process) under 48 concurrent requests, streamed and not: in
    every stored trace, read back to the nanosecond (OTLP/JSON of the v3 API), no span starts before or
    ends after its parent, and the first_token event is at the span's start + its TTFT attribute."""
    import concurrent.futures

    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(tmp_path)))
    with Collector(config) as collector:
        api = collector.jaeger.url
        server = ServerProcess("--otlp-traces-endpoint", f"{collector.http.endpoint}/v1/traces",
                               env={"OTEL_BSP_SCHEDULE_DELAY": "100"}).start()
        try:
            def one(i: int) -> None:
                client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
                if i % 2:
                    for _ in client.chat.completions.create(model="dummy", max_tokens=16 + i, stream=True,
                                                            messages=[{"role": "user", "content": f"q{i}"}]):
                        pass
                else:
                    client.completions.create(model="dummy", prompt=f"p{i} " * (i + 1), max_tokens=8 + i)
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                list(pool.map(one, range(48)))
            start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))
            end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
            search = {"query.serviceName": "otel-llm", "query.startTimeMin": start, "query.startTimeMax": end,
                      "query.searchDepth": "100", "query.attributes": '{"span.kind": "server"}'}
            assert wait_until(lambda: len(get(api, "/api/v3/trace-summaries", **search)["summaries"]) == 48
                              and all(s.get("spanCount") == 5 for s in get(api, "/api/v3/trace-summaries",
                                                                           **search)["summaries"]), timeout_s=30)
        finally:
            server.stop()
        summaries = get(api, "/api/v3/trace-summaries", **search)["summaries"]
        checked = 0
        for summary in summaries:
            doc = get(api, f"/api/v3/traces/{summary['traceId']}")
            spans = {s["spanId"]: s for rs in doc["result"]["resourceSpans"] for ss in rs["scopeSpans"]
                     for s in ss["spans"]}
            assert len(spans) == 5  # HTTP server > gen_ai span > queue, prefill, decode
            for span in spans.values():
                t0, t1 = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
                assert t0 <= t1
                parent = spans.get(span.get("parentSpanId", ""))
                if parent is not None:
                    assert int(parent["startTimeUnixNano"]) <= t0 and t1 <= int(parent["endTimeUnixNano"]), \
                        (span["name"], parent["name"], int(parent["startTimeUnixNano"]) - t0)
                    checked += 1
                ttft = next((a["value"]["doubleValue"] for a in span.get("attributes", [])
                             if a["key"] == "gen_ai.latency.time_to_first_token"), None)
                if ttft is not None:
                    [event] = [e for e in span["events"] if e["name"] == "first_token"]
                    assert abs(int(event["timeUnixNano"]) - t0 - ttft * 1e9) < 2, (ttft, event)  # float rounding
        assert checked == 48 * 4
