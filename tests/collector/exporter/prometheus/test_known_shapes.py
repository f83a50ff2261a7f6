"""The store's fast path: an export shaped as its sender's last is applied exactly as the full path
would apply it (every series' state, the exposition, OpenMetrics exemplars), under every profile,
and the store forgets shapes whose series may be gone."""

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.metrics import Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from otel_llm.collector.exporter.prometheus import known_shapes
from otel_llm.collector.exporter.prometheus.exposition import render
from otel_llm.collector.exporter.prometheus.metric_store import MetricStore, StoreConfig
from otel_llm.collector.pdata import metrics_layout
from otel_llm.collector.pdata.otlp_codec import PayloadError
from otel_llm.shim.profiles import PROFILE_NAMES
from tests.collector.exporter.prometheus.test_metric_store import Clock, otlp_of, serve_some
from tests.collector.otlp_builders import DELTA, SEC, counter, request, samples
from tests.otel_llm.conftest import Harness


def state(store: MetricStore) -> dict:
    """Every input series' state, exemplars decoded (types too: a value read as 0 is the int 0)."""
    out = {}
    for key, metric in store._metrics.items():
        for attributes, s in metric.series.items():
            exemplars = [e if type(e) is tuple else (e.trace_id, e.span_id, e.as_double, e.as_int, e.time_unix_nano)
                         for e in s.exemplars or ()]
            out[key, attributes] = (s.value, type(s.value), s.start_ns, s.time_ns, s.counts, s.count, s.sum,
                                    type(s.sum), s.seen_s, s.group.labels, exemplars)
    return out


@pytest.fixture
def applied(monkeypatch) -> list:
    """Exports the fast path applied (one entry each); a shape is learnt again after any miss."""
    monkeypatch.setattr(known_shapes, "_MAX_BACKOFF", 0)
    calls, real = [], known_shapes.Shape.apply
    monkeypatch.setattr(known_shapes.Shape, "apply", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


class Pair:
    """The store as it runs, and one that takes every export by the full path, fed the same exports."""

    def __init__(self, profile: str = "vllm") -> None:
        self.clock = Clock()
        self.fast = MetricStore(StoreConfig(profile=profile), clock=self.clock)
        self.full = MetricStore(StoreConfig(profile=profile), clock=self.clock)

    def send(self, payload: bytes) -> None:
        self.clock.t += 1
        assert self.fast.ingest(payload) == self.full._ingest(payload)
        assert state(self.fast) == state(self.full)
        for openmetrics in (False, True):
            assert render(self.fast, openmetrics) == render(self.full, openmetrics)


def edited(payload: bytes, edit) -> bytes:
    """The payload with `edit(kind, point)` applied to every data point (real opentelemetry-proto classes)."""
    req = ExportMetricsServiceRequest.FromString(payload)
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                for p in getattr(m, kind).data_points:
                    edit(kind, p)
    return req.SerializeToString()


def at(t: int):
    def edit(kind, p):
        p.time_unix_nano = t
    return edit


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_a_servers_exports_apply_as_the_full_path_applies_them(profile, applied):
    pair, h = Pair(profile), Harness(cache_config={"block_size": "16", "num_gpu_blocks": "128"})
    exports = []
    for _ in range(5):
        serve_some(h, 3)
        exports.append(otlp_of(h, "srv-1"))
    for payload in exports:
        pair.send(payload)
    latest = exports[-1]
    later = max(p.time_unix_nano for _, _, _, p in _points(latest)) + SEC

    def restart(kind, p):  # the sender restarted: new start, no exemplars yet
        p.start_time_unix_nano += 1
        p.time_unix_nano = later
        if kind == "histogram":
            del p.exemplars[:]

    def no_value(kind, p):
        p.flags = 1

    def zeros(kind, p):
        if kind != "histogram":
            p.as_double = 0.0

    assert len(applied) == 3  # the first export is taken in full, the second's new exemplars too
    steps = [edited(latest, at(SEC)),  # older than the state: ignored
             edited(latest, restart), edited(edited(latest, restart), at(later + SEC))]
    for i, edit in enumerate((no_value, zeros)):  # a new shape: the first in full, the others fast
        steps += [edited(edited(latest, edit), at(later + (3 * i + k) * SEC)) for k in range(3)]
    for step in steps:
        pair.send(step)
    assert len(applied) == 3 + 1 + 1 + 2 + 2


def _points(payload: bytes):
    req = ExportMetricsServiceRequest.FromString(payload)
    return [(rm, sm, m, p) for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            for p in getattr(m, m.WhichOneof("data")).data_points]


def test_the_opentelemetry_sdks_own_exports_apply_as_the_full_path_applies_them(applied):
    """Every instrument kind, exemplars from sampled spans (the SDK's reservoirs: they come and go)."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "app"})).get_meter("m")
    tracer = TracerProvider().get_tracer("t")
    requests, latency = meter.create_counter("app.requests"), meter.create_histogram("app.latency", unit="s")
    queue = meter.create_up_down_counter("app.queue")
    meter.create_observable_gauge("app.temperature", callbacks=[lambda options: [Observation(21.5, {"room": "a"})]])
    pair = Pair("otel")
    for i in range(16):
        if i < 12:  # then quiet: the same series, no exemplars
            with tracer.start_as_current_span("work"):
                requests.add(1 + i % 2, {"route": "/a" if i % 3 else "/b"})
                queue.add(1 if i % 2 else -1)
                if i % 4:
                    latency.record(0.01 * (1 + i % 5), {"route": "/a"})
            assert trace.get_current_span() is trace.INVALID_SPAN
        pair.send(encode_metrics(reader.get_metrics_data()).SerializeToString())
    assert len(applied) >= 4


def test_delta_sums_always_take_the_full_path(applied):
    pair = Pair("otel")
    for t in range(2, 8):
        pair.send(request([counter("app.events", 1.0, start=(t - 1) * SEC, time=t * SEC, temporality=DELTA)]))
    assert not applied
    assert all(shape.layout is None for shape in pair.fast._shapes.values())


def test_a_shape_is_forgotten_when_its_series_are_removed():
    clock = Clock()
    store = MetricStore(StoreConfig(profile="otel", expiry_s=10), clock=clock)
    for t in range(2, 5):
        store.ingest(request([counter("app.requests", t, {"route": "/a"}, time=t * SEC)]))
    assert sum(s.hits for s in store._shapes.values()) == 1
    clock.t += 11
    assert store.expire() == 1 and store.num_series() == 0 and not store._shapes
    result = store.ingest(request([counter("app.requests", 9, {"route": "/a"}, time=9 * SEC)]))
    assert result.accepted == 1 and store.num_series() == 1  # the series again, not a write to the removed one
    assert [v for k, v in samples(render(store).decode()).items() if k.startswith("app_requests_total")] == [9]


def test_a_sender_whose_shape_never_holds_costs_few_layout_walks(monkeypatch):
    walks = []
    real = metrics_layout.Layout.of
    monkeypatch.setattr(metrics_layout.Layout, "of", classmethod(lambda cls, p: walks.append(1) or real(p)))
    store = MetricStore(StoreConfig(profile="otel"))
    shapes = [request([counter("app.requests", 1, {"route": route})]) for route in ("/a", "/bb")]
    for i in range(400):
        assert store.ingest(shapes[i % 2]).refused == 0
    assert len(walks) <= 12, len(walks)  # backing off to one walk per 64 misses
    for _ in range(70):  # a shape that holds again is learnt again, within 64 misses
        store.ingest(shapes[0])
    (shape,) = store._shapes.values()
    assert shape.layout.values(shapes[0]) is not None and shape.hits >= 5


def test_bad_bytes_where_a_senders_key_is_read_are_a_clear_400():
    store = MetricStore()
    for payload in (b"\x0a" + b"\xff" * 11 + b"\x01", b"\x0a\x7f\x0a\x7f"):
        with pytest.raises(PayloadError) as caught:
            store.ingest(payload)
        assert caught.value.status == 400
