"""The collector with real parts: OTel SDK exporters (HTTP and gRPC) from several servers in,
a real Prometheus scraping it, promtool on its exposition (HELP texts with quotes, backslashes and
newlines included), real `otel-llm serve` processes."""

from __future__ import annotations

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.sdk.metrics import (
    Counter, Histogram, MeterProvider, ObservableCounter, ObservableGauge, ObservableUpDownCounter, UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from otel_llm.collector.exporter.prometheus.metric_store import StoreConfig
from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.shim.profiles import PROFILE_NAMES
from tests.collector.exporter.prometheus.test_metric_store import serve_some
from tests.collector.otlp_builders import counter, request, samples
from tests.harness.prometheus import promtool_check_metrics
from tests.otel_llm.conftest import Harness
from tests.server.api.api_server_harness import ServerProcess, wait_until

_KINDS = (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge)


def new_collector(profile: str = "vllm", **store) -> Collector:
    return Collector(CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0,
                                     store=StoreConfig(profile=profile, **store)))


def scrape(collector: Collector, openmetrics: bool = False) -> str:
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    return httpx.get(collector.scrape.url, headers=accept, timeout=10).text


def push_from_servers(collector: Collector, requests_per_server: dict[str, int]) -> None:
    """Each 'server' is a Telemetry with its own resource, pushing through the SDK's OTLP exporter:
    even-numbered ones over HTTP, odd ones over gRPC."""
    for i, (instance, n) in enumerate(requests_per_server.items()):
        h = Harness()
        serve_some(h, n)
        exporter = (HttpMetricExporter(endpoint=f"{collector.http.endpoint}/v1/metrics") if i % 2 == 0
                    else GrpcMetricExporter(endpoint=collector.grpc.endpoint, insecure=True))
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        h.tel.attach_reader(reader, Resource.create({"service.name": "otel-llm", "service.instance.id": instance}))
        reader.collect()
        reader.shutdown()


def test_sdk_exporters_over_http_and_grpc_reach_the_scrape_endpoint():
    with new_collector() as collector:
        push_from_servers(collector, {"a": 3, "b": 4, "c": 5})
        text = scrape(collector)
        values = samples(text)
        for instance, n in {"a": 3, "b": 4, "c": 5}.items():
            key = (f'vllm:request_success_total{{model_name="m",engine="0",finished_reason="length",'
                   f'job="otel-llm",instance="{instance}"}}')
            assert values[key] == n - 1  # the first request of each is aborted
        own = samples(scrape(collector))
        assert own['otelcol_receiver_accepted_metric_points_total{receiver="otlp",transport="http"}'] > 0
        assert own['otelcol_receiver_accepted_metric_points_total{receiver="otlp",transport="grpc"}'] > 0
        assert own['otelcol_receiver_refused_metric_points_total{receiver="otlp",transport="grpc"}'] == 0
        om = scrape(collector, openmetrics=True)
        assert om.endswith("# EOF\n") and ' # {trace_id="' in om


def test_an_ordinary_otel_app_passes_through_with_delta_temporality():
    with new_collector() as collector:
        exporter = HttpMetricExporter(endpoint=f"{collector.http.endpoint}/v1/metrics",
                                      preferred_temporality={k: AggregationTemporality.DELTA for k in _KINDS})
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        provider = MeterProvider([reader], resource=Resource.create({"service.name": "shop",
                                                                     "service.instance.id": "shop-1"}))
        orders = provider.get_meter("shop.orders", "2.0").create_counter("shop.orders", unit="{order}")
        latency = provider.get_meter("shop.orders", "2.0").create_histogram("shop.checkout.duration", unit="s")
        for batch in (3, 4):
            for _ in range(batch):
                orders.add(1, {"payment": "card"})
                latency.record(0.2, {"payment": "card"})
            reader.collect()
        provider.shutdown()
        values = samples(scrape(collector))
        labels = 'payment="card",otel_scope_name="shop.orders",otel_scope_version="2.0",job="shop",instance="shop-1"'
        assert values[f"shop_orders_total{{{labels}}}"] == 7  # two deltas accumulated
        assert values[f"shop_checkout_duration_seconds_count{{{labels}}}"] == 7


def test_partial_success_and_bad_input_over_both_transports():
    with new_collector(cardinality_limit=5) as collector:
        points = request([counter(f"bad{i}", 1, temporality=0) for i in range(2)])
        answer = httpx.post(f"{collector.http.endpoint}/v1/metrics", content=points,
                            headers={"Content-Type": "application/x-protobuf"}, timeout=10)
        response = metrics_service_pb2.ExportMetricsServiceResponse.FromString(answer.content)
        assert answer.status_code == 200 and response.partial_success.rejected_data_points == 2
        assert "temporality unspecified" in response.partial_success.error_message
        bad = httpx.post(f"{collector.http.endpoint}/v1/metrics", content=b"\x0a\xff\xff",
                         headers={"Content-Type": "application/x-protobuf"}, timeout=10)
        assert bad.status_code == 400 and b"malformed protobuf" in bad.content
        traces = httpx.post(f"{collector.http.endpoint}/v1/traces", content=b"",
                            headers={"Content-Type": "application/x-protobuf"}, timeout=10)
        assert traces.status_code == 404 and b"/v1/metrics" in traces.content
        with grpc.insecure_channel(collector.grpc.endpoint) as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                                         request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as err:
                export(b"\x0a\xff\xff", timeout=10)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed protobuf" in err.value.details()
        assert "bad0" not in scrape(collector)


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_promtool_check_metrics(profile):
    with new_collector(profile) as collector:
        push_from_servers(collector, {"a": 3, "b": 2})
        findings = promtool_check_metrics(scrape(collector))
    if profile == "otel":
        assert findings == []
    else:  # only what the copied servers' own names cause: a server's own /metrics gets the same findings
        h = Harness()
        serve_some(h, 3)
        assert findings and set(findings) <= set(promtool_check_metrics(h.tel.render(profile=profile).decode()))


@pytest.mark.slow
def test_real_prometheus_scrapes_the_collector_with_exact_totals(prometheus_server):
    with new_collector() as collector:
        push_from_servers(collector, {"a": 3, "b": 4, "c": 5})
        prom = prometheus_server(f"127.0.0.1:{collector.scrape.port}", honor_labels=True, job="collector")
        prom.wait_for_scrapes(1)
        per_instance = {r["metric"]["instance"]: float(r["value"][1]) for r in
                        prom.query('sum by (instance) (vllm:request_success_total{finished_reason="length"})')}
        assert per_instance == {"a": 2, "b": 3, "c": 4}
        assert prom.value("sum(vllm:request_success_total)") == 12
        assert prom.value('sum(vllm:generation_tokens_total{job="otel-llm"})') == 36


@pytest.mark.slow
def test_real_servers_push_to_the_collector():
    """Two `otel-llm serve` processes push over OTLP (HTTP and gRPC) to the collector."""
    with new_collector() as collector:
        env = {"OTEL_METRIC_EXPORT_INTERVAL": "300"}
        http_server = ServerProcess("--otlp-metrics-endpoint", collector.http.endpoint, env=env)
        grpc_server = ServerProcess("--otlp-metrics-endpoint", f"http://{collector.grpc.endpoint}",
                                    env={**env, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"})
        servers = [http_server.start(), grpc_server.start()]
        try:
            for server, n in zip(servers, (3, 5)):
                for _ in range(n):
                    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                                   json={"model": "dummy", "prompt": "hi", "max_tokens": 4})
                    assert r.status_code == 200
            def totals():
                values = samples(scrape(collector))
                found = {k: v for k, v in values.items()
                         if k.startswith("vllm:request_success_total") and 'reason="length"' in k}
                return found if sorted(found.values()) == [3, 5] else None
            found = wait_until(totals, timeout_s=30)
            assert found, scrape(collector)
            instances = {k.split('instance="')[1].split('"')[0] for k in found}
            assert len(instances) == 2  # each server process has its own service.instance.id
        finally:
            for server in servers:
                server.stop()


@pytest.mark.slow
def test_real_prometheus_receives_the_collectors_remote_write(prometheus_server):
    """Servers push over HTTP and gRPC; the collector remote-writes (no scrape) to a real Prometheus:
    totals exact per instance and summed, histograms usable, exemplars stored, target_info per server."""
    prom = prometheus_server(None, extra_flags=("--web.enable-remote-write-receiver",
                                                "--enable-feature=exemplar-storage"))
    collector = Collector(CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0,
                                          remote_write_urls=(f"{prom.url}/api/v1/write",)))
    with collector:
        push_from_servers(collector, {"a": 3, "b": 4, "c": 5})
        found = wait_until(lambda: prom.query("sum by (instance) (vllm:request_success_total)"), timeout_s=30)
        assert {r["metric"]["instance"]: float(r["value"][1]) for r in found} == {"a": 3, "b": 4, "c": 5}
        assert prom.value("sum(vllm:request_success_total)") == 12
        assert prom.value('sum(vllm:request_success_total{finished_reason="abort"})') == 3
        assert prom.value('sum(vllm:generation_tokens_total{job="otel-llm"})') == 36
        assert prom.value("count(target_info)") == 3
        p50 = prom.value('histogram_quantile(0.5, sum by (le) (vllm:e2e_request_latency_seconds_bucket))')
        assert 0 < p50 < 1
        exemplars = httpx.get(f"{prom.url}/api/v1/query_exemplars", timeout=10, params={
            "query": "vllm:e2e_request_latency_seconds_bucket", "start": 0, "end": 4e9}).json()["data"]
        assert exemplars and all(len(e["labels"]["trace_id"]) == 32 for x in exemplars for e in x["exemplars"])
        own = samples(scrape(collector))
        sent = own['otelcol_exporter_sent_metric_points_total{exporter="prometheusremotewrite/0",data_type="metrics"}']
        assert sent > 0
        assert own['otelcol_exporter_send_failed_metric_points_total{exporter="prometheusremotewrite/0",'
                   'data_type="metrics"}'] == 0


def test_help_text_with_quotes_backslashes_and_newlines_is_escaped_as_each_format_requires():
    """Text format 0.0.4 escapes only backslash and newline in HELP (a `\\"` fails promtool for the
    whole exposition); OpenMetrics 1.0 escapes the double quote too."""
    description = 'Orders "placed", C:\\shop\\orders\nsecond line'
    metric = counter("shop.orders", 3)
    metric.description = description
    with new_collector() as collector:
        answer = httpx.post(f"{collector.http.endpoint}/v1/metrics", content=request([metric]),
                            headers={"Content-Type": "application/x-protobuf"}, timeout=10)
        assert answer.status_code == 200
        text, openmetrics = scrape(collector), scrape(collector, openmetrics=True)
    assert '# HELP shop_orders_total Orders "placed", C:\\\\shop\\\\orders\\nsecond line\n' in text
    assert promtool_check_metrics(text) == []
    assert '# HELP shop_orders Orders \\"placed\\", C:\\\\shop\\\\orders\\nsecond line\n' in openmetrics
    for parse, exposition in ((text_string_to_metric_families, text),
                              (openmetrics_families, openmetrics)):
        families = {f.name: f for f in parse(exposition)}
        assert families["shop_orders"].documentation == description
        assert [s.value for s in families["shop_orders"].samples if s.name == "shop_orders_total"] == [3]
