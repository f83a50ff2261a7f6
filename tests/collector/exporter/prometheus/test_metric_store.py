"""The collector's metric store and exposition: shim parity with the server, temporality,
restarts, expiry, cardinality limits and bad input."""

import re

import pytest
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.sdk.resources import Resource

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot
from otel_llm.collector.exporter.prometheus.exposition import render
from otel_llm.collector.exporter.prometheus.metric_store import MetricStore, StoreConfig
from otel_llm.collector.pdata.otlp_codec import PayloadError
from otel_llm.export.metric_producer import to_metrics_data
from tests.collector.otlp_builders import DELTA, SEC, counter, gauge, histogram, kvs, request, samples
from tests.otel_llm.conftest import Harness


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def serve_some(h: Harness, n: int = 6) -> None:
    """n requests through a Telemetry: alternating operations, one aborted; one more refused at admission."""
    h.tel.reject("max_num_queued_reqs")
    t = 1_000_000_000
    for i in range(n):
        rid = h.tel.arrival(RequestInfo(f"r{i}", prompt_tokens=10 + i, operation="chat" if i % 2 else "text_completion",
                                        max_tokens=3))
        h.at(t).queued(rid)
        h.at(t + 1000).scheduled(rid)
        h.step(t + 2000, t + 3000, 10 + i)
        for k in range(3):
            h.at(t + 10**6 * (k + 2)).outputs([rid], 1)
            if k == 2:
                h.rec.finished(rid, FinishReason.ABORT if i == 0 else FinishReason.LENGTH)
            h.rec.snapshot(SchedulerSnapshot(running=1, waiting=2, kv_usage=0.25, prefix_queries=10, prefix_hits=4))
            h.step(t + 10**6 * (k + 2), t + 10**6 * (k + 2) + 500)
        t += 10**8


def otlp_of(h: Harness, instance: str) -> bytes:
    resource = Resource.create({"service.name": "otel-llm", "service.instance.id": instance})
    return encode_metrics(to_metrics_data([h.tel], resource)).SerializeToString()


def without_job_instance(text: str) -> dict[str, float]:
    out = {}
    for series, value in samples(text).items():
        if series.startswith("target_info"):
            continue
        out[re.sub(r',?(job|instance)="[^"]*"', "", series).replace("{}", "")] = value
    return out


@pytest.mark.parametrize("profile", ["vllm", "otel"])
def test_collector_exposes_exactly_what_the_server_does(profile):
    h = Harness(metrics_compat=profile, cache_config={"block_size": "16", "num_gpu_blocks": "128"})
    serve_some(h)
    store = MetricStore(StoreConfig(profile=profile))
    result = store.ingest(otlp_of(h, "srv-1"))
    assert result.refused == 0 and result.accepted > 20
    collected = render(store).decode()
    ours, servers = without_job_instance(collected), without_job_instance(h.tel.render().decode())
    assert ours == pytest.approx(servers, rel=1e-12)  # same series, same values (sums in another order)
    assert 'job="otel-llm",instance="srv-1"' in collected
    assert 'target_info{service_name' not in collected and "target_info{telemetry_sdk_language=" in collected
    if profile == "vllm":
        assert 'vllm:cache_config_info{block_size="16",num_gpu_blocks="128",engine="0",job="otel-llm"' in collected
        assert samples(collected)['vllm:request_success_total{model_name="m",engine="0",finished_reason="length",'
                                  'job="otel-llm",instance="srv-1"}'] == 5


def test_openmetrics_carries_the_servers_exemplars():
    h = Harness()
    serve_some(h)
    store = MetricStore()
    store.ingest(otlp_of(h, "srv-1"))
    text = render(store, openmetrics=True).decode()
    assert text.endswith("# EOF\n")
    ttft = [line for line in text.splitlines() if line.startswith("vllm:time_to_first_token_seconds_bucket") and " # " in line]
    assert ttft and re.search(r' # \{trace_id="[0-9a-f]{32}",span_id="[0-9a-f]{16}"\} [0-9.e-]+ \d+\.\d{3}$', ttft[0])


def test_servers_never_collide_and_sum_exactly():
    store = MetricStore()
    for i, n in enumerate((3, 4, 5)):
        h = Harness()
        serve_some(h, n)
        store.ingest(otlp_of(h, f"srv-{i}"))
    values = samples(render(store).decode())
    success = {k: v for k, v in values.items() if k.startswith("vllm:request_success_total") and 'reason="length"' in k}
    assert sorted(success.values()) == [2, 3, 4] and len(success) == 3


def test_other_apps_keep_their_own_names_under_the_spec_rules():
    store = MetricStore()
    payload = request([
        histogram("http.server.duration", [1, 2, 0], [5.0, 10.0], 17.0, {"http.method": "GET"}, unit="ms"),
        counter("app.requests", 7, {"route": "/a", "1st": "x"}, unit="{request}"),
        gauge("cpu.utilization", 0.5, unit="1"),
        counter("queue.depth", 3, monotonic=False),
    ], service="shop", instance="", **{"service.namespace": "prod", "host.name": "h1"})
    assert store.ingest(payload).refused == 0
    text = render(store).decode()
    labels = 'otel_scope_name="test.scope",otel_scope_version="1.0",job="prod/shop"'
    values = samples(text)
    assert values[f'http_server_duration_milliseconds_bucket{{http_method="GET",{labels},le="5.0"}}'] == 1
    assert values[f'http_server_duration_milliseconds_count{{http_method="GET",{labels}}}'] == 3
    assert values[f'app_requests_total{{key_1st="x",route="/a",{labels}}}'] == 7
    assert values[f"cpu_utilization_ratio{{{labels}}}"] == 0.5
    assert "# TYPE queue_depth gauge" in text and values[f"queue_depth{{{labels}}}"] == 3
    assert values['target_info{host_name="h1",job="prod/shop"}'] == 1


def test_restart_resets_and_older_points_are_ignored():
    store = MetricStore()
    series = 'c_total{otel_scope_name="test.scope",otel_scope_version="1.0",job="app",instance="i-1"}'
    store.ingest(request([counter("c", 10, start=SEC, time=5 * SEC)]))
    store.ingest(request([counter("c", 4, start=SEC, time=3 * SEC)]))  # late, older: ignored
    assert samples(render(store).decode())[series] == 10
    store.ingest(request([counter("c", 2, start=9 * SEC, time=10 * SEC)]))  # new start time: restarted
    assert samples(render(store).decode())[series] == 2


def test_delta_points_accumulate_into_cumulative():
    store = MetricStore()
    store.ingest(request([counter("d", 5, start=SEC, time=2 * SEC, temporality=DELTA),
                          histogram("h", [1, 0], [1.0], 0.5, start=SEC, time=2 * SEC, temporality=DELTA)]))
    store.ingest(request([counter("d", 7, start=2 * SEC, time=3 * SEC, temporality=DELTA),
                          histogram("h", [0, 2], [1.0], 4.0, start=2 * SEC, time=3 * SEC, temporality=DELTA)]))
    overlap = store.ingest(request([counter("d", 100, start=2 * SEC, time=4 * SEC, temporality=DELTA)]))
    assert overlap.refused == 1 and "overlaps" in overlap.reason
    values = {k.split("{")[0]: v for k, v in samples(render(store).decode()).items()
              if not k.startswith("target_info") and "le=" not in k}
    assert values == {"d_total": 12, "h_seconds_sum": 4.5, "h_seconds_count": 3}


def test_silent_series_expire():
    clock = Clock()
    store = MetricStore(StoreConfig(expiry_s=60), clock=clock)
    store.ingest(request([counter("a", 1)], instance="old"))
    clock.t += 45
    store.ingest(request([counter("a", 1)], instance="new"))
    clock.t += 30
    assert store.expire() == 1
    text = render(store).decode()
    assert 'instance="old"' not in text and 'instance="new"' in text
    clock.t += 61
    assert store.expire() == 1 and render(store) == b"" and store.num_series() == 0


def test_a_sender_whose_series_went_is_taken_again_and_can_go_again():
    """The store finds a sender's metrics by name from the sender's plan: a metric whose series all
    expired or stopped being scraped leaves it, so the next point is placed (and indexed) anew."""
    clock = Clock()
    store = MetricStore(StoreConfig(expiry_s=60), clock=clock)
    store.ingest(request([counter("a", 1), gauge("g", 5)], instance="x"))
    clock.t += 61
    assert store.expire() == 2 and store.num_series() == 0 and render(store) == b""
    store.ingest(request([counter("a", 2)], instance="x"))
    labels = '{otel_scope_name="test.scope",otel_scope_version="1.0",job="app",instance="x"}'
    assert samples(render(store).decode())["a_total" + labels] == 2
    resource = next(iter(store.resources))
    since = clock.t + 1
    clock.t += 2
    store.ingest(request([gauge("g", 7)], instance="x"))
    assert store.drop_unseen(resource, since) == 1  # `a` was not in the last scrape
    store.ingest(request([counter("a", 3)], instance="x"))
    values = samples(render(store).decode())
    assert values["a_total" + labels] == 3 and values["g" + labels] == 7
    clock.t += 61
    assert store.expire() == 2 and store.num_series() == 0 and store.resources == {}


def test_cardinality_limit_overflow_series_and_bounded_memory():
    store = MetricStore(StoreConfig(cardinality_limit=100))
    points = [metrics_pb2.NumberDataPoint(attributes=kvs({"user": f"u{i}"}), start_time_unix_nano=SEC,
                                          time_unix_nano=2 * SEC, as_double=1.0) for i in range(10_000)]
    result = store.ingest(request([counter("hits", 0, points=points)]))
    assert result.accepted == 200 and result.refused == 9_800 and "cardinality limit of 100" in result.reason
    assert store.num_series() == 200
    values = samples(render(store).decode())
    overflow = [v for k, v in values.items() if 'otel_metric_overflow="true"' in k]
    assert overflow == [100.0]
    assert sum(1 for k in values if k.startswith("hits_total{user=")) == 100


def test_global_series_limit_refuses_with_a_reason():
    store = MetricStore(StoreConfig(max_series=3))
    result = store.ingest(request([counter(f"m{i}", 1) for i in range(5)]))
    assert (result.accepted, result.refused) == (3, 2) and "limit of 3 series" in result.reason


def test_bad_input_is_refused_clearly():
    store = MetricStore()
    with pytest.raises(PayloadError) as err:
        store.ingest(b"\x0a\xff\xff\xff")
    assert err.value.status == 400 and "malformed protobuf" in err.value.reason
    expo = metrics_pb2.Metric(name="e", exponential_histogram=metrics_pb2.ExponentialHistogram(
        data_points=[metrics_pb2.ExponentialHistogramDataPoint(count=1)], aggregation_temporality=2))
    unspecified = counter("u", 1, temporality=0)
    clash_a, clash_b = gauge("same", 1), counter("same", 1, unit="", monotonic=True)
    clash_b.name = "same_total"  # -> family "same" too, as a counter
    result = store.ingest(request([expo, unspecified, clash_a, clash_b]))
    assert result.refused == 3 and result.accepted == 1
    assert "exponential_histogram points are not supported" in result.reason
    assert "temporality unspecified" in result.reason and "already a gauge" in result.reason
    wrong_bounds = histogram("hb", [1, 1, 1], [1.0, 2.0], 3.0)
    store.ingest(request([histogram("hb", [1, 1], [1.0], 2.0)]))
    assert "bucket bounds differ" in store.ingest(request([wrong_bounds])).reason
    assert store.ingest(ExportMetricsServiceRequest().SerializeToString()) == (0, 0, "")


def test_a_silent_servers_precreated_series_leave_with_it():
    """vLLM's labelled children (finished_reason=stop/abort/... at 0) belong to their sender: when one
    server expires, none of its series stay behind, while the other server's are untouched."""
    clock = Clock()
    store = MetricStore(StoreConfig(expiry_s=60), clock=clock)
    for instance in ("gone", "alive"):
        h = Harness()
        serve_some(h, 3)
        store.ingest(otlp_of(h, instance))
        clock.t += 45 if instance == "gone" else 0
    before = samples(render(store).decode())
    clock.t += 30
    assert store.expire() > 0
    after = samples(render(store).decode())
    assert not [k for k in after if 'instance="gone"' in k]
    assert after == {k: v for k, v in before.items() if 'instance="gone"' not in k}
    assert 'vllm:request_success_total{model_name="m",engine="0",finished_reason="stop",job="otel-llm",' \
           'instance="alive"}' in after


def test_series_a_profile_leaves_out_are_accepted_never_shown_and_expire():
    """Triton counts successes only: a sender whose requests all stopped has no failure of its own, yet
    its failure series are pre-created at 0 (as Triton does at model load); they leave with it."""
    clock = Clock()
    store = MetricStore(StoreConfig(profile="triton", expiry_s=60), clock=clock)
    h = Harness()
    rid = h.tel.arrival(RequestInfo("r", prompt_tokens=10))
    h.at(1_000_000_000).scheduled(rid)
    h.at(1_002_000_000).outputs([rid], 1)
    h.rec.finished(rid, FinishReason.STOP)
    h.step(1_002_000_000, 1_003_000_000, 10)
    assert store.ingest(otlp_of(h, "srv-1")).refused == 0
    values = without_job_instance(render(store).decode())
    assert values['nv_inference_request_success{model="m",version="1"}'] == 1
    assert values['nv_inference_request_failure{model="m",version="1",reason="CANCELED"}'] == 0
    assert values['nv_inference_request_failure{model="m",version="1",reason="BACKEND"}'] == 0
    clock.t += 61
    assert store.expire() > 0 and store.num_series() == 0 and store.families == {}
