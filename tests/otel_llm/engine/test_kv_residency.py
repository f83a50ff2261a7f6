"""vLLM's `--kv-cache-metrics`: sampled KV block residency (lifetime, idle before eviction, reuse
gaps) from a block manager's calls, through the step record, to the `vllm` and `otel` expositions
and OTLP; only when configured; custom buckets; vLLM's own eviction events through the plugin path."""

from types import SimpleNamespace as NS

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from otel_llm import StepRecord
from otel_llm.canonical import instruments as I
from otel_llm.engine.kv_residency import KVEvictions, KVResidencySampler
from otel_llm.export.metric_producer import to_metrics
from otel_llm.shim.custom_buckets import parse_specs
from tests.harness.prometheus import promtool_check_metrics
from tests.otel_llm.conftest import Clock, Harness

S, MS = 1_000_000_000, 1_000_000
FAMILIES = ("vllm:kv_block_lifetime_seconds", "vllm:kv_block_idle_before_evict_seconds",
            "vllm:kv_block_reuse_gap_seconds")


def sampler(rate=1.0, picks=None):
    clock = Clock(0)
    rng = iter(picks).__next__ if picks is not None else (lambda: 0.0)
    return KVResidencySampler(rate, clock=clock, rng=rng), clock


def test_lifetime_idle_and_reuse_gaps_as_vllm_computes_them():
    s, clock = sampler()
    s.allocated(7)
    for t in (1, 3, 6, 10, 15):  # five hits: vLLM keeps the last four
        clock.t = t * S
        s.accessed(7)
    clock.t = 20 * S
    s.allocated(8)
    clock.t = 21 * S
    s.evicted(7)
    s.evicted(8)  # never accessed: idle since its allocation, no gap
    s.evicted(9)  # never allocated (not sampled): nothing
    ev = s.drain()
    assert ev.lifetime_ns.tolist() == [21 * S, 1 * S]
    assert ev.idle_ns.tolist() == [6 * S, 1 * S]
    assert ev.reuse_gap_ns.tolist() == [3 * S, 4 * S, 5 * S]  # between 3, 6, 10, 15
    assert s.drain() is None


def test_only_sampled_blocks_count_and_reset_forgets():
    s, clock = sampler(0.25, picks=[0.1, 0.5, 0.2, 0.9])
    for block in range(4):
        s.allocated(block)
    clock.t = S
    for block in range(4):
        s.evicted(block)
    assert len(s.drain().lifetime_ns) == 2  # blocks 0 and 2 drew below the rate
    s2, _ = sampler()
    s2.allocated(1)
    s2.reset()
    s2.evicted(1)
    assert s2.drain() is None


@pytest.mark.parametrize("rate", [0, -0.1, 1.5, True, "0.1"])
def test_a_bad_sample_rate_is_named(rate):
    with pytest.raises(ValueError, match="kv_cache_metrics_sample"):
        KVResidencySampler(rate)


def evictions() -> KVEvictions:
    return KVEvictions(np.array([2 * MS, 40 * S], np.int64), np.array([MS, 25 * S], np.int64),
                       np.array([3 * MS, 700 * S, 1900 * S], np.int64))


def drive(h: Harness) -> None:
    h.rec.kv_evictions(evictions())
    h.rec.kv_evictions(None)
    h.step(S, S)
    h.rec.kv_evictions(KVEvictions(np.array([S], np.int64), np.array([S], np.int64), np.zeros(0, np.int64)))
    h.step(2 * S, 2 * S)


def test_record_round_trip_and_steady_steps_unchanged():
    h = Harness()
    h.rec.kv_evictions(evictions())
    h.rec.outputs([1, 2], 1)
    data = h.rec.end_step_bytes(0)
    rec = StepRecord.from_bytes(data)
    assert [a.tolist() for a in rec.kv_evictions] == [a.tolist() for a in evictions()]
    assert rec.to_bytes() == data and rec.spec_decoding is None and rec.event_external is None
    h.rec.outputs([1, 2], 1)
    assert StepRecord.from_bytes(h.rec.end_step_bytes(0)).kv_evictions is None
    for bad in (data[:-8], data + b"\0" * 8):
        with pytest.raises(ValueError):
            StepRecord.from_bytes(bad)


def hist(text: str, name: str) -> dict:
    fam = next(f for f in parse_text(text) if f.name == name)
    return {(s.name, s.labels.get("le")): s.value for s in fam.samples}


def test_vllm_families_exact_and_only_with_kv_cache_metrics():
    off = Harness()
    drive(off)
    text = off.tel.render().decode()
    assert not any(name in text for name in FAMILIES)
    assert not any(m.name.startswith(I.KV_BLOCK) for m in to_metrics(off.tel))

    h = Harness(kv_cache_metrics=True)
    drive(h)
    text = h.tel.render().decode()
    types = {f.name: (f.type, f.documentation) for f in parse_text(text)}
    table = I.instrument_table(8192)
    for name, canonical in zip(FAMILIES, ("lifetime", "idle_before_evict", "reuse_gap")):
        assert types[name] == ("histogram", table[I.KV_BLOCK + canonical].description)
    lifetime = hist(text, FAMILIES[0])
    bounds = [float(k[1]) for k in lifetime if k[0].endswith("_bucket") and k[1] != "+Inf"]
    assert tuple(bounds) == I.VLLM_KV_CACHE_RESIDENCY
    assert lifetime[(FAMILIES[0] + "_count", None)] == 3
    assert lifetime[(FAMILIES[0] + "_sum", None)] == pytest.approx(0.002 + 40 + 1)
    assert lifetime[(FAMILIES[0] + "_bucket", "0.002")] == 1 and lifetime[(FAMILIES[0] + "_bucket", "60.0")] == 3
    gaps = hist(text, FAMILIES[2])
    assert gaps[(FAMILIES[2] + "_count", None)] == 3
    assert gaps[(FAMILIES[2] + "_bucket", "1800.0")] == 2 and gaps[(FAMILIES[2] + "_bucket", "+Inf")] == 3
    idle = hist(text, FAMILIES[1])
    assert idle[(FAMILIES[1] + "_sum", None)] == pytest.approx(0.001 + 25 + 1)
    otel = h.tel.render(profile="otel").decode()
    assert hist(otel, "otel_llm_kv_block_lifetime_seconds")[("otel_llm_kv_block_lifetime_seconds_count", None)] == 3
    promtool_check_metrics(otel)
    exported = {m.name: m.data.data_points[0] for m in to_metrics(h.tel) if m.name.startswith(I.KV_BLOCK)}
    assert exported[I.KV_BLOCK + "lifetime"].count == 3
    assert tuple(exported[I.KV_BLOCK + "reuse_gap"].explicit_bounds) == I.VLLM_KV_CACHE_RESIDENCY


def test_custom_buckets_change_the_exposition_and_otlp():
    h = Harness(kv_cache_metrics=True, custom_histogram_buckets=parse_specs(["kv_cache_residency=0.01,10"]))
    drive(h)
    lifetime = hist(h.tel.render().decode(), FAMILIES[0])
    assert [k[1] for k in lifetime if k[0].endswith("_bucket")] == ["0.01", "10.0", "+Inf"]
    assert lifetime[(FAMILIES[0] + "_bucket", "10.0")] == 2  # 2 ms and 1 s
    exported = {m.name: m.data.data_points[0] for m in to_metrics(h.tel)}
    assert tuple(exported[I.KV_BLOCK + "idle_before_evict"].explicit_bounds) == (0.01, 10.0)


def test_negative_times_are_a_counted_drop():
    h = Harness(kv_cache_metrics=True)
    h.rec.kv_evictions(KVEvictions(np.array([-1], np.int64), np.array([0], np.int64), np.zeros(0, np.int64)))
    h.step(S, S)
    assert h.counter("otel_llm.telemetry.dropped")[0] == 1
    assert h.hist(I.KV_BLOCK + "lifetime").counts.sum() == 0


def test_vllm_eviction_events_feed_the_same_instruments():
    from otel_llm.vllm.stats import VllmStatsAggregator

    agg = VllmStatsAggregator("m", 8192, vllm_families=False, kv_cache_metrics=True)
    events = [NS(lifetime_seconds=0.002, idle_seconds=0.001, reuse_gaps_seconds=(0.003, 700.0)),
              NS(lifetime_seconds=40.0, idle_seconds=25.0, reuse_gaps_seconds=())]
    sched = NS(num_running_reqs=1, num_waiting_reqs=0, num_skipped_waiting_reqs=0, kv_cache_usage=0.1,
               prefix_cache_stats=NS(queries=0, hits=0), connector_prefix_cache_stats=None,
               spec_decoding_stats=None, kv_cache_eviction_events=events)
    agg.record(sched, None)
    exported = {m.name: m.data.data_points[0] for m in to_metrics(agg.engines[0])}
    assert exported[I.KV_BLOCK + "lifetime"].count == 2
    assert exported[I.KV_BLOCK + "lifetime"].sum == pytest.approx(40.002)
    assert exported[I.KV_BLOCK + "reuse_gap"].count == 2

