"""What the collector remote-writes: the scrape endpoint's series as samples, only what changed,
resent before Prometheus would call them stale, and ended with staleness markers when they expire."""

import math

import pytest

from otel_llm.collector.exporter.prometheus.exposition import render
from otel_llm.collector.exporter.prometheus.metric_store import MetricStore, StoreConfig
from otel_llm.collector.exporter.remote_write.proto import STALE_NAN
from otel_llm.collector.exporter.remote_write.series import RemoteWriteSeries
from otel_llm.shim.profiles import PROFILE_NAMES
from tests.collector.exporter.prometheus.test_metric_store import otlp_of
from tests.collector.otlp_builders import SEC, counter, histogram, request, samples
from tests.collector.processor.test_metric_routes import CACHE, drive
from tests.otel_llm.conftest import Harness

TRACE, SPAN = bytes(range(16)), bytes(range(8))


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def by_name(series) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in series:
        out.setdefault(dict(s.labels)["__name__"], []).append(s)
    return out


def exposition_samples(store: MetricStore) -> dict[str, float]:
    """The scrape endpoint's samples keyed like `key()` below (sorted labels), target_info left out."""
    out = {}
    for line, value in samples(render(store).decode()).items():
        name, _, rest = line.partition("{")
        pairs = [p.split("=", 1) for p in rest.rstrip("}").split('",') if p] if rest else []
        labels = tuple(sorted([("__name__", name)] + [(k, v.strip('"')) for k, v in pairs]))
        out[labels] = value
    return out


def test_samples_are_the_scrape_endpoints_series_with_exemplars():
    store = MetricStore(StoreConfig(profile="otel"))
    store.ingest(request([
        counter("orders", 7, {"payment": "card"}, time=5 * SEC),
        histogram("latency", [1, 2, 0], [0.1, 0.5], 0.9, time=5 * SEC, exemplar=(TRACE, SPAN, 0.3)),
    ]))
    pushed = RemoteWriteSeries(clock=Clock()).collect(store)
    series = {s.labels: s for s in pushed}
    expected = {k: v for k, v in exposition_samples(store).items() if ("__name__", "target_info") not in k}
    assert {k: series[k].value for k in expected} == expected
    assert all(series[k].timestamp_ms == 5000 for k in expected)  # the point's time, not the push's
    buckets = by_name(pushed)["latency_seconds_bucket"]
    (with_exemplar,) = [s for s in buckets if s.exemplar is not None]
    assert dict(with_exemplar.labels)["le"] == "0.5"
    assert dict(with_exemplar.exemplar.labels) == {"trace_id": TRACE.hex(), "span_id": SPAN.hex()}
    assert with_exemplar.exemplar.value == 0.3
    assert len(by_name(pushed)["target_info"]) == 1


def test_only_what_changed_then_a_resend_before_staleness():
    clock = Clock(5.0)  # the wall clock, a few seconds after the points' times
    store = MetricStore()
    rw = RemoteWriteSeries(resend_s=60, clock=clock)
    store.ingest(request([counter("a", 1, time=2 * SEC), counter("b", 1, time=2 * SEC)]))
    assert set(by_name(rw.collect(store))) == {"a_total", "b_total", "target_info"}
    assert rw.collect(store) == []  # nothing changed
    store.ingest(request([counter("a", 2, time=3 * SEC), counter("b", 1, time=2 * SEC)]))
    changed = rw.collect(store)
    assert [(dict(s.labels)["__name__"], s.value, s.timestamp_ms) for s in changed] == [("a_total", 2.0, 3000)]
    clock.t += 61
    resent = by_name(rw.collect(store))
    assert set(resent) == {"a_total", "b_total", "target_info"}  # unchanged for a minute: sent again
    # stamped on the sender's timeline: the last stamp + the time since it was sent
    assert [s.timestamp_ms for s in resent["a_total"] + resent["b_total"]] == [3000 + 61_000, 2000 + 61_000]


def test_expired_series_and_their_target_info_get_staleness_markers():
    clock, wall = Clock(), Clock(10_000.0)
    store = MetricStore(StoreConfig(expiry_s=60), clock=clock)
    rw = RemoteWriteSeries(clock=wall)
    store.ingest(request([counter("a", 1), histogram("h", [1, 0], [1.0], 0.5)], instance="gone"))
    store.ingest(request([counter("a", 1)], instance="alive"))
    first = rw.collect(store)
    gone = {s.labels for s in first if dict(s.labels).get("instance") == "gone"}
    assert len(gone) == 1 + 4 + 1  # a_total, h's two buckets + _sum + _count, target_info
    clock.t += 45
    store.ingest(request([counter("a", 2, time=3 * SEC)], instance="alive"))
    clock.t += 30
    wall.t += 75
    assert store.expire() == 2
    markers = rw.collect(store)
    stale = {s.labels for s in markers if math.isnan(s.value)}
    assert stale == gone
    assert all(s.value is STALE_NAN for s in markers if dict(s.labels)["instance"] == "gone")
    fresh = {dict(s.labels)["__name__"]: s.value for s in markers if dict(s.labels)["instance"] == "alive"}
    assert fresh == {"a_total": 2.0, "target_info": 1.0}  # changed, and resent after a minute
    assert all(s.timestamp_ms > 2000 for s in markers if math.isnan(s.value))  # after the last sample
    assert rw.collect(store) == []  # ended once


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_every_profile_remote_writes_the_series_it_shows(profile):
    """Names (TGI's and Triton's counters without `_total`), labels, scaled values (Triton's us and
    ms) and bucket bounds: remote-write carries exactly the scrape endpoint's series."""
    h = Harness(cache_config=CACHE, num_speculative_tokens=3)
    drive(h)
    store = MetricStore(StoreConfig(profile=profile))
    assert store.ingest(otlp_of(h, "srv-1")).refused == 0
    series = {s.labels: s.value for s in RemoteWriteSeries(clock=Clock()).collect(store)}
    expected = {k: v for k, v in exposition_samples(store).items() if ("__name__", "target_info") not in k}
    assert len(expected) > 50 and {k: series[k] for k in expected} == expected
    assert len(series) == len(expected) + 1  # and the sender's target_info
