"""VllmStatsAggregator: vLLM's per-step stats objects (duck-typed here) -> exact aggregates, never an exception."""

from enum import Enum
from types import SimpleNamespace as NS

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_llm.canonical.instruments import PERF_COUNTERS
from otel_llm.export.metric_producer import attach_reader, to_metrics
from otel_llm.vllm.stats import VllmStatsAggregator


def finished(rng, reason):
    return NS(finish_reason=reason, e2e_latency=rng.uniform(0, 3), queued_time=rng.uniform(0, 1),
              prefill_time=rng.uniform(0, 1), inference_time=rng.uniform(0, 2), decode_time=rng.uniform(0, 2),
              num_preemptions=int(rng.integers(0, 3)), num_prompt_tokens=int(rng.integers(1, 900)),
              num_cached_tokens=int(rng.integers(0, 16)), num_generation_tokens=int(rng.integers(1, 300)),
              mean_time_per_output_token=rng.uniform(0, 0.2), max_tokens_param=[None, 0, 64][reason % 3])


def itls(rng):
    """A step's ITLs: all equal (steady decode: one timestamp difference, separate float objects) or not."""
    n = int(rng.integers(0, 64))
    if rng.integers(0, 2):
        return [float(v) for v in np.full(n, rng.uniform(0, 0.1))]
    return [float(v) for v in rng.uniform(0, 0.1, n)]


def step(rng, n_fin):
    pts = NS(total=int(rng.integers(0, 50)), computed=int(rng.integers(0, 50)), local_cache_hit=3,
             external_kv_transfer=0, cached_tokens=3)
    return NS(num_generation_tokens=int(rng.integers(0, 64)), prompt_token_stats=pts, num_preempted_reqs=1,
              time_to_first_tokens_iter=list(rng.uniform(0, 1, int(rng.integers(0, 3)))),
              inter_token_latencies_iter=itls(rng), max_num_generation_tokens_iter=[5] * n_fin,
              n_params_iter=[1] * n_fin if rng.integers(0, 2) else [int(n) for n in rng.integers(1, 3, n_fin)],
              finished_requests=[finished(rng, int(rng.integers(0, 5))) for _ in range(n_fin)])


def sched(running):
    return NS(num_running_reqs=running, num_waiting_reqs=2, num_skipped_waiting_reqs=1, kv_cache_usage=0.5,
              prefix_cache_stats=NS(queries=10, hits=4), connector_prefix_cache_stats=None)


@pytest.mark.parametrize("vllm_families", [True, False], ids=["replace", "add"])
def test_aggregates_equal_a_direct_computation(vllm_families):
    rng = np.random.default_rng(3)
    agg = VllmStatsAggregator("m", 1024, flush_every=7, vllm_families=vllm_families)
    steps = [step(rng, int(rng.integers(0, 4))) for _ in range(100)]
    for i, it in enumerate(steps):
        agg.record(sched(i), it, None, 0)
    snap = agg.engines[0].snapshot()
    itl = np.concatenate([s.inter_token_latencies_iter for s in steps])
    h = snap.histograms["otel_llm.request.inter_token_latency"]
    assert h.counts.sum() == len(itl) and h.sums.sum() == pytest.approx(itl.sum())
    want = np.bincount(np.searchsorted(h.bounds, itl, side="left"), minlength=h.counts.shape[1])
    assert (h.counts.sum(axis=0) == want).all()
    assert (h.mins.min(), h.maxs.max()) == (itl.min(), itl.max())
    n = np.concatenate([s.n_params_iter for s in steps])
    hn = snap.histograms["otel_llm.request.params.n"]
    assert (hn.counts.sum(axis=0) == np.bincount(np.searchsorted(hn.bounds, n), minlength=len(hn.bounds) + 1)).all()
    fins = [f for s in steps for f in s.finished_requests]
    e2e = snap.histograms["gen_ai.server.request.duration"]
    assert e2e.counts.sum() == len(fins) and e2e.sums.sum() == pytest.approx(sum(f.e2e_latency for f in fins))
    by_reason = snap.counters["otel_llm.request.finished"].reshape(-1, 5).sum(axis=0)
    assert by_reason.tolist() == np.bincount([f.finish_reason for f in fins], minlength=5).tolist()
    mt = snap.histograms["otel_llm.request.params.max_tokens"]
    assert mt.counts.sum() == sum(1 for f in fins if f.max_tokens_param)  # as vLLM: only when set
    assert snap.counters["otel_llm.usage.generation_tokens"][0] == sum(s.num_generation_tokens for s in steps)
    assert snap.counters["otel_llm.prefix_cache.queries"][0] == 1000
    assert snap.gauges["otel_llm.scheduler.running"] == 99 and snap.gauges["otel_llm.scheduler.waiting"] == 3
    assert snap.histograms["otel_llm.step.tokens"].counts.sum() == 100
    # canonical in both modes (OTLP carries them): vLLM's prompt split, waiting by reason, prefill KV tokens
    by_source = snap.counters["otel_llm.usage.prompt_tokens_by_source"]
    assert by_source.tolist() == [sum(s.prompt_token_stats.computed for s in steps), 300, 0]
    assert snap.counters["otel_llm.usage.prompt_tokens_cached"][0] == 300
    assert snap.gauges["otel_llm.scheduler.waiting_by_reason"].tolist() == [2, 1]
    kv = snap.histograms["otel_llm.request.prefill_kv_computed_tokens"]
    assert kv.counts.sum() == len(fins)
    assert kv.sums.sum() == sum(f.num_prompt_tokens - f.num_cached_tokens for f in fins)
    # vLLM's cached tokens by tier: this engine's hits are `device` (no connector here), in both modes
    assert snap.counters["otel_llm.prefix_cache.hits_by_source"].tolist() == [400, 0, 0, 0, 0]


def test_garbage_is_counted_never_raised_and_the_queue_is_bounded():
    agg = VllmStatsAggregator("m", 1024, flush_every=4)
    for _ in range(10):
        agg.record(object(), "not stats", None, 0)  # folding fails: logged once, counted
    assert len(agg._pending) == 2 and agg.errors == 2 and agg.dropped == 8
    agg.flush()
    agg.record(sched(1), step(np.random.default_rng(0), 1), None, 0)  # later steps are folded again
    snap = agg.engines[0].snapshot()
    assert snap.counters["otel_llm.telemetry.dropped"][0] == 10
    assert snap.counters["otel_llm.request.finished"].sum() == 1


def test_gauges_left_to_another_process_and_engines_apart():
    agg = VllmStatsAggregator("m", 1024, engine_indexes=[0, 1], scheduler_gauges=False)
    agg.record(sched(5), None, None, 1)
    agg.flush()
    assert agg.engines[1].snapshot().gauges["otel_llm.scheduler.running"] is None
    assert agg.engines[1].snapshot().counters["otel_llm.prefix_cache.hits"][0] == 4
    assert agg.engines[0].snapshot().counters["otel_llm.prefix_cache.hits"][0] == 0


def test_delta_temporality_exports_what_changed_since_the_last_collection():
    agg = VllmStatsAggregator("m", 1024)
    reader = InMemoryMetricReader()
    attach_reader(reader, agg.engines.values(), temporality="delta")
    rng = np.random.default_rng(1)

    def points():
        data = reader.get_metrics_data()
        return {m.name: m.data for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}

    for _ in range(3):
        agg.record(sched(1), step(rng, 2), None, 0)
    first = points()
    agg.record(sched(1), step(rng, 1), None, 0)
    second = points()
    assert first["otel_llm.request.finished"].aggregation_temporality.name == "DELTA"
    assert sum(p.value for p in second["otel_llm.request.finished"].data_points) == 1
    assert sum(p.count for p in second["gen_ai.server.request.duration"].data_points) == 1
    assert sum(p.count for p in first["gen_ai.server.request.duration"].data_points) == 6
    with pytest.raises(ValueError, match="temporality"):
        attach_reader(InMemoryMetricReader(), [], temporality="sometimes")


def as_release_0_15(it, s):
    """The same step as vLLM 0.15 hands it over: one prompt-token number per step, finished requests without
    `num_cached_tokens`/`num_preemptions`, a scheduler without skipped waiting requests."""
    old_fins = [NS(**{k: v for k, v in vars(f).items() if k not in ("num_cached_tokens", "num_preemptions")})
                for f in it.finished_requests]
    fields = {k: v for k, v in vars(it).items() if k != "prompt_token_stats"}
    old_it = NS(**{**fields, "num_prompt_tokens": it.prompt_token_stats.total, "finished_requests": old_fins})
    old_s = NS(**{**{k: v for k, v in vars(s).items() if k != "num_skipped_waiting_reqs"},
                  "connector_prefix_cache_stats": NS(queries=6, hits=2)})  # no hits_by_source before 0.32
    return old_it, old_s


def test_an_older_releases_stats_fold_as_that_release_counts_them():
    rng = np.random.default_rng(5)
    steps = [(step(rng, int(rng.integers(0, 4))), sched(i)) for i in range(60)]
    agg = VllmStatsAggregator("m", 1024, flush_every=9, step_tokens_computed=False)  # vLLM before 0.23
    for it, s in steps:
        agg.record(*as_release_0_15(it, s)[::-1], None, 0)
    snap = agg.engines[0].snapshot()
    assert agg.dropped == 0 and agg.errors == 0
    fins = [f for it, _ in steps for f in it.finished_requests]
    assert snap.counters["otel_llm.request.finished"].sum() == len(fins)
    e2e = snap.histograms["gen_ai.server.request.duration"]
    assert e2e.sums.sum() == pytest.approx(sum(f.e2e_latency for f in fins))
    assert snap.counters["otel_llm.usage.prompt_tokens"][0] == sum(it.prompt_token_stats.total for it, _ in steps)
    # vLLM < 0.23 observes a step's scheduled prompt tokens (`num_prompt_tokens`) plus its generated ones
    tokens = snap.histograms["otel_llm.step.tokens"]
    want = sum(it.prompt_token_stats.total + it.num_generation_tokens for it, _ in steps)
    assert tokens.counts.sum() == 60 and tokens.sums.sum() == want
    assert snap.counters["otel_llm.usage.prompt_tokens_by_source"].sum() == 0  # no split before vLLM 0.16
    # what the release does not measure is not observed: preemptions per request (0.30), cached tokens (0.13)
    assert snap.histograms["otel_llm.request.prefill_kv_computed_tokens"].counts.sum() == 0
    assert snap.histograms["otel_llm.request.preemptions"].counts.sum() == 0
    assert snap.histograms["otel_llm.request.prompt_tokens"].counts.sum() == len(fins)
    assert snap.gauges["otel_llm.scheduler.waiting"] == 2  # no skipped waiting requests before vLLM 0.20
    assert snap.counters["otel_llm.prefix_cache.hits"][0] == 240  # connector stats read without hits_by_source


def test_goodput_judges_each_finished_request_from_its_stats():
    """TTFT = e2e - decode time (vLLM carries no per-request TTFT), TPOT = vLLM's mean (two or more
    tokens), e2e as its histogram, errors = finish reason ERROR; pushed and judged per engine."""
    from otel_llm.canonical.instruments import SLO_MISSED
    from otel_llm.slo.config import parse_slo_config
    from otel_llm.slo.goodput import GOODPUT

    slo = parse_slo_config({"objectives": [{"model": "m", "ttft": {"threshold": 0.5, "target": 0.9},
                                            "tpot": {"threshold": 0.1, "target": 0.9},
                                            "e2e": {"threshold": 2.5, "target": 0.9}, "errors": {"target": 0.9}}]})
    rng = np.random.default_rng(7)
    agg = VllmStatsAggregator("m", 1024, flush_every=5, slo=slo)
    want: dict[str, int] = {}
    for _ in range(60):
        it = step(rng, int(rng.integers(0, 4)))
        for r in it.finished_requests:
            missed = [k for k, bad in (
                ("ttft", r.e2e_latency - r.decode_time > 0.5), ("tpot", r.num_generation_tokens > 1 and
                                                                 r.mean_time_per_output_token > 0.1),
                ("e2e", r.e2e_latency > 2.5), ("errors", r.finish_reason == 3)) if bad]
            key = "+".join(missed) or "none"
            want[key] = want.get(key, 0) + 1
        agg.record(sched(1), it)
    agg.flush()
    c = agg.engines[0].snapshot().counters[GOODPUT].reshape(-1, len(SLO_MISSED)).sum(axis=0)
    assert {SLO_MISSED[i]: int(v) for i, v in enumerate(c) if v} == want and len(want) > 4
    reader = InMemoryMetricReader()
    attach_reader(reader, agg.engines.values())
    points = [p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics if m.name == GOODPUT for p in m.data.data_points]
    assert sum(p.value for p in points) == sum(want.values())


def test_vllm_perf_stats_are_summed_as_its_mfu_counters_where_it_declares_them():
    """vLLM's `--enable-mfu-metrics`: each step's `SchedulerStats.perf_stats` adds to
    `otel_llm.engine.estimated_*` (exported); a release that does not declare the families
    (before 0.17) exports none."""
    def sched(flops):
        return NS(num_running_reqs=1, num_waiting_reqs=0, num_skipped_waiting_reqs=0, kv_cache_usage=0.1,
                  prefix_cache_stats=NS(queries=0, hits=0), connector_prefix_cache_stats=None, spec_decoding_stats=None,
                  kv_cache_eviction_events=None,
                  perf_stats=NS(num_flops_per_gpu=flops, num_read_bytes_per_gpu=flops // 2, num_write_bytes_per_gpu=7))

    on = VllmStatsAggregator("m", 8192, vllm_families=False, mfu_metrics=True)
    off = VllmStatsAggregator("m", 8192, vllm_families=False)
    for agg in (on, off):
        for flops in (10**12, 3 * 10**11):
            agg.record(sched(flops), None)
    exported = {m.name: m.data.data_points[0].value for m in to_metrics(on.engines[0])}
    assert [exported[name] for name in PERF_COUNTERS] == [1.3e12, 6.5e11, 14.0]
    assert not {m.name for m in to_metrics(off.engines[0])} & set(PERF_COUNTERS)


def test_add_mode_exports_every_family_vllm_declares_at_zero_sleep_cache_config_and_tiers():
    """What vLLM's own logger shows before any event: admission rejections and cached tokens by tier at 0
    for every label value, the multimodal cache at 0, the engine awake, the cache config as an info point;
    then the sleep states as vLLM's `record_sleep_state` sets them, and a connector's hits by tier."""
    agg = VllmStatsAggregator("m", 1024, engine_indexes=(0, 1), vllm_families=False)
    agg.cache_config({"block_size": 16, "num_gpu_blocks": 128, "enable_prefix_caching": True})

    def points(engine=0):
        out = {}
        for m in to_metrics(agg.engines[engine]):
            for p in m.data.data_points:
                key = tuple(v for k, v in sorted(p.attributes.items()) if k.startswith(("otel_llm.cache_source",
                            "otel_llm.sleep_state", "otel_llm.rejection_reason", "otel_llm.cache_config.")))
                out[(m.name, key)] = p.value
        return out

    got = points()
    assert {k[1]: v for k, v in got.items() if k[0] == "otel_llm.prefix_cache.hits_by_source"} == {
        (t,): 0 for t in ("device", "host", "p2p", "disk", "external_unspecified")}
    assert {k[1]: v for k, v in got.items() if k[0] == "otel_llm.admission.rejections"} == {
        ("max_num_queued_reqs",): 0, ("max_num_queued_tokens",): 0}
    assert got[("otel_llm.mm_cache.queries", ())] == got[("otel_llm.mm_cache.hits", ())] == 0
    assert {k[1]: v for k, v in got.items() if k[0] == "otel_llm.engine.sleep_state"} == {
        ("awake",): 1, ("weights_offloaded",): 0, ("discard_all",): 0}
    assert got[("otel_llm.cache_config.info", ("16", "True", "128"))] == 1
    for sleep, level, want in ((1, 1, (0, 1, 0)), (1, 2, (0, 0, 1)), (0, 0, (1, 0, 0)), (1, 7, (0, 0, 0))):
        agg.sleep(sleep, level)  # vLLM's record_sleep_state(sleep, level), every engine
        for engine in (0, 1):
            states = {k[1][0]: v for k, v in points(engine).items() if k[0] == "otel_llm.engine.sleep_state"}
            assert tuple(states[s] for s in ("awake", "weights_offloaded", "discard_all")) == want
    tier = Enum("CacheHitSource", {"HOST": "host", "P2P": "p2p"})  # vLLM 0.32's members (str values)
    connector = NS(queries=50, hits=30, hits_by_source={tier.HOST: 20, tier.P2P: 10})
    s = NS(num_running_reqs=1, num_waiting_reqs=0, num_skipped_waiting_reqs=0, kv_cache_usage=0.1,
           prefix_cache_stats=NS(queries=10, hits=4), connector_prefix_cache_stats=connector)
    agg.record(s, None, NS(queries=6, hits=2), 0)
    agg.record(s, None, None, 0)
    got = points()
    assert {k[1][0]: v for k, v in got.items() if k[0] == "otel_llm.prefix_cache.hits_by_source"} == {
        "device": 8, "host": 40, "p2p": 20, "disk": 0, "external_unspecified": 0}
    assert (got[("otel_llm.mm_cache.queries", ())], got[("otel_llm.mm_cache.hits", ())]) == (6, 2)
    older = NS(queries=50, hits=30)  # before vLLM 0.32: no tiers, so the connector's hits are unspecified
    agg.record(NS(**{**vars(s), "connector_prefix_cache_stats": older}), None, None, 1)
    assert {k[1][0]: v for k, v in points(1).items() if k[0] == "otel_llm.prefix_cache.hits_by_source"} == {
        "device": 4, "host": 0, "p2p": 0, "disk": 0, "external_unspecified": 30}
