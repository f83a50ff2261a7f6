"""LoRA (`vllm:lora_requests_info`, per-adapter counts) and cardinality limits (overflow series).

`VllmLoraStates` mirrors vLLM 0.32's `LoRAStats`/`LoRARequestStates` (`vllm/v1/metrics/stats.py`)
and the three lines of `PrometheusStatLogger.record` that set `vllm:lora_requests_info`
(`vllm/v1/metrics/loggers.py`); `SCRIPT` run through vLLM's own classes (in `.venv-vllm`) gives
the series `EXPECTED` pins. `get_latest_lora_metric` and `populate_lora_metrics` mirror the
endpoint picker at kubernetes-sigs/gateway-api-inference-extension `a70292c1~1`
(`pkg/epp/framework/plugins/datalayer/extractor/metrics/loraspec.go` `getLatestMetric`: the
matching series with the largest value, first on ties, after `extractFamily`; `extractor.go`
`populateLoRAMetrics`/`addAdapters`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families as parse_text

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot, StepRecord, StepRecorder, Telemetry, TelemetryConfig
from otel_llm.export.exposition import Renderer
from otel_llm.export.metric_producer import attach_reader
from otel_llm.shim.profiles import get_profile
from tests.harness.prometheus import promtool_check_metrics
from tests.otel_llm.conftest import Harness
from tests.otel_llm.shim.test_gie import VLLM, MetricFamily, parse_string_to_spec, text_to_metric_families

S, MS = 1_000_000_000, 1_000_000
INFO = "vllm:lora_requests_info"
OVERFLOW = {"otel_metric_overflow": "true"}


class VllmLoraStates:
    """vLLM 0.32 `LoRARequestStates` (log_stats=True) and its gauge labels, as the logger sets them."""

    def __init__(self, max_lora: int):
        self.max_lora = max_lora
        self.requests: defaultdict[str, tuple[set, set]] = defaultdict(lambda: (set(), set()))

    def update(self, req_id, lora_name, waiting: bool, running: bool) -> None:
        if lora_name is None:
            return
        stats = self.requests[lora_name]
        (stats[0].add if waiting else stats[0].discard)(req_id)
        (stats[1].add if running else stats[1].discard)(req_id)
        if not (stats[0] or stats[1]):
            del self.requests[lora_name]

    def labels(self) -> dict[str, str]:
        # update_scheduler_stats writes every adapter into both dicts; record joins their keys
        waiting_lora_adapters = {name: len(w) for name, (w, r) in self.requests.items()}
        running_lora_adapters = {name: len(r) for name, (w, r) in self.requests.items()}
        return {"max_lora": str(self.max_lora), "running_lora_adapters": ",".join(running_lora_adapters.keys()),
                "waiting_lora_adapters": ",".join(waiting_lora_adapters.keys())}


# One list per engine step, in the order the Telemetry applies them (a frontend failure when it is
# called, then the step's events, then its finishes): (event, request, adapter); Q/S/P: QUEUED/
# SCHEDULED/PREEMPTED, F: finished by the engine, A: failed by the frontend (`Telemetry.fail`).
SCRIPT = [
    [("Q", "r1", "a"), ("Q", "r2", "b"), ("Q", "r0", None)],
    [("S", "r1", "a"), ("S", "r0", None)],
    [("Q", "r3", "a"), ("F", "r1", "a")],
    [("S", "r2", "b"), ("S", "r3", "a"), ("F", "r3", "a")],
    [("Q", "r4", "a")],
    [("Q", "r5", "c")],
    [("A", "r5", "c"), ("S", "r4", "a"), ("F", "r2", "b")],
    [("P", "r4", "a")],
    [("F", "r4", "a"), ("F", "r0", None)],
]
NO_SNAPSHOT = {4}  # that step carries no scheduler snapshot (vLLM: no SchedulerStats), so it sets nothing
# vLLM 0.32's own LoRARequestStates on SCRIPT: the series in creation order, and the step each was last set at
# ("b,a", the state after step 4, is never set; adapters are listed as they (re)entered, not sorted).
EXPECTED = [("a,b", 2), ("b", 3), ("b,a,c", 5), ("a", 7), ("", 8)]


def run_script(h: Harness, script=SCRIPT, until: int | None = None) -> tuple[list[dict], list[float]]:
    """Drive `h` through `script`; returns vLLM's series (labels, in creation order) and their values
    as the frontend's wall time when each was last set."""
    vllm = VllmLoraStates(h.tel.config.max_loras)
    rids: dict[str, int] = {}
    series: dict[tuple, float] = {}
    for i, step in enumerate(script[:until]):
        t = 2 * S + i * 10 * MS
        h.eclock.t = t
        for kind, rid, name in step:
            if kind == "Q":
                h.fclock.t = t
                rids[rid] = h.tel.arrival(RequestInfo(rid, 5, lora_name=name))
                h.rec.queued(rids[rid])
                vllm.update(rid, name, True, False)
            elif kind == "S":
                h.rec.scheduled(rids[rid], 0)
                vllm.update(rid, name, False, True)
            elif kind == "P":
                h.rec.preempted(rids[rid])
                vllm.update(rid, name, True, False)
            elif kind == "F":
                h.rec.finished(rids[rid], FinishReason.STOP)
                vllm.update(rid, name, False, False)
            else:
                h.tel.fail(rids[rid], FinishReason.ABORT)
                vllm.update(rid, name, False, False)
        if i not in NO_SNAPSHOT:
            h.rec.snapshot(SchedulerSnapshot(running=1, waiting=1, kv_usage=0.1))
        received = t + 3 * MS
        h.step(t, received)
        if i not in NO_SNAPSHOT:
            series[tuple(vllm.labels().items())] = wall_s(h.tel, received)
    return [dict(k) for k in series], list(series.values())


def wall_s(tel: Telemetry, mono_ns: int) -> float:
    return (tel.anchor[0] + mono_ns - tel.anchor[1]) / 1e9


def samples(text: str, family: str) -> list[tuple[dict, float]]:
    fams = {f.name: f for f in parse_text(text)}
    return [(s.labels, s.value) for s in fams[family].samples] if family in fams else []


# -- vllm:lora_requests_info ---------------------------------------------------------------


def test_lora_requests_info_series_are_vllms():
    h = Harness(max_loras=4)
    want, values = run_script(h)
    assert [d["running_lora_adapters"] for d in want] == [w for w, _ in EXPECTED]  # the mirror is vLLM
    text = h.tel.render().decode()
    got = samples(text, INFO)
    assert [labels for labels, _ in got] == want  # label values, order: what vLLM sets
    assert [v for _, v in got] == values  # each: the wall time of the step that last set it
    assert [v for _, v in got] == [wall_s(h.tel, 2 * S + step * 10 * MS + 3 * MS) for _, step in EXPECTED]
    assert all(d["waiting_lora_adapters"] == d["running_lora_adapters"] and d["max_lora"] == "4" for d in want)
    assert "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n" \
        in text
    # exactly vLLM's labels (no model_name / engine), as prometheus_client writes them (names sorted)
    line = next(x for x in text.splitlines() if x.startswith(INFO + "{"))
    assert line.startswith('vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",'
                           'waiting_lora_adapters="a,b"} ')


def test_lora_family_has_no_series_before_the_first_snapshot_and_none_without_max_loras():
    h = Harness(max_loras=2)
    h.tel.arrival(RequestInfo("r", 5, lora_name="a"))
    text = h.tel.render().decode()
    assert f"# TYPE {INFO} gauge\n" in text and samples(text, INFO) == []  # declared, no child yet (as vLLM)
    off = Harness()  # max_loras=0: vLLM without --enable-lora
    run_script(off)
    assert INFO not in off.tel.render().decode()
    assert not off.tel.lora.live  # nothing tracked either
    # the per-adapter counter counts regardless (otel profile)
    assert {d["otel_llm_lora_adapter"]: v for d, v in samples(off.tel.render(profile="otel").decode(),
                                                              "otel_llm_lora_requests")} == {"a": 3, "b": 1, "c": 1}


def test_requests_without_an_adapter_track_nothing():
    h = Harness(max_loras=4)
    rid = h.tel.arrival(RequestInfo("r", 5))
    h.at(S).queued(rid)
    h.rec.snapshot(SchedulerSnapshot(1, 0, 0.0))
    h.step(S, S)
    assert not h.tel.lora.live
    got = samples(h.tel.render().decode(), INFO)
    assert [labels for labels, _ in got] == [{"max_lora": "4", "running_lora_adapters": "",
                                              "waiting_lora_adapters": ""}]
    assert "otel_llm_lora_requests" not in h.tel.render(profile="otel").decode()


# -- the endpoint picker ---------------------------------------------------------------------


class LoraMetrics(NamedTuple):
    active: dict[str, int]
    waiting: dict[str, int]
    max_active: int


def get_latest_lora_metric(spec_text: str, fams: dict[str, MetricFamily]):
    """loraspec.go getLatestMetric: extractFamily, then the largest value among matching series."""
    spec = parse_string_to_spec(spec_text)
    fam = fams.get(spec.name)
    if fam is None:
        raise LookupError(f"metric family {spec.name!r} not found")
    if not fam.metrics:
        raise LookupError(f"no metrics found for {spec.name!r}")
    latest, recent = None, -1.0
    for m in fam.metrics:
        if spec.labels.items() <= m.labels.items() and m.value > recent:
            latest, recent = m, m.value
    if latest is None:
        raise LookupError(f"no matching lora metric found for {spec.name!r}")
    return latest


def populate_lora_metrics(metric, max_active: int = 0) -> LoraMetrics:
    """extractor.go populateLoRAMetrics: adapters from the labels (split on ',', trimmed, '' skipped)."""
    active, waiting = {}, {}
    for name, value in metric.labels.items():
        if name == "running_lora_adapters":
            active.update((a.strip(), 0) for a in value.split(",") if a.strip())
        elif name == "waiting_lora_adapters":
            waiting.update((a.strip(), 0) for a in value.split(",") if a.strip())
        elif name == "max_lora" and value:
            max_active = int(value)
    return LoraMetrics(active, waiting, max_active)


def picker(text: str) -> LoraMetrics:
    return populate_lora_metrics(get_latest_lora_metric(VLLM["lora"], text_to_metric_families(text)))


def test_the_picker_reads_the_latest_series():
    h = Harness(max_loras=4)
    with pytest.raises(LookupError, match="no metrics found"):  # declared, nothing set yet
        picker(h.tel.render().decode())
    run_script(h, until=3)
    assert picker(h.tel.render().decode()) == LoraMetrics({"a": 0, "b": 0}, {"a": 0, "b": 0}, 4)
    run_script(h := Harness(max_loras=4), until=6)  # the older "a,b" and "b" series are still there
    assert picker(h.tel.render().decode()) == LoraMetrics({"b": 0, "a": 0, "c": 0}, {"b": 0, "a": 0, "c": 0}, 4)
    run_script(h := Harness(max_loras=4))
    assert picker(h.tel.render().decode()) == LoraMetrics({}, {}, 4)  # idle: the latest series lists none


def test_the_picker_after_overflow_sees_no_adapters_until_a_known_combination_returns():
    """The overflow series has only `otel_metric_overflow`: while the current combination is one beyond
    the limit, the picker reads no adapters (and keeps its previous max); a raised limit avoids it."""
    h = Harness(max_loras=4, cardinality_limit=2)
    run_script(h, until=4)  # "a,b", then "b": the limit
    rid = h.tel.arrival(RequestInfo("x1", 5, lora_name="x"))  # "b,x": beyond it
    h.at(9 * S).queued(rid)
    h.rec.snapshot(SchedulerSnapshot(1, 1, 0.1))
    h.step(9 * S, 9 * S)
    text = h.tel.render().decode()
    assert samples(text, INFO)[-1][0] == OVERFLOW
    assert picker(text) == LoraMetrics({}, {}, 0)


# -- cardinality limits: LoRA adapters -------------------------------------------------------


def flood(h: Harness, n: int) -> None:
    """n requests, one adapter each, one after another: each step queues the next and finishes the
    previous, so each step sets a new combination (just the new adapter)."""
    prev = None
    for i in range(n):
        t = S + i * MS
        h.fclock.t = t
        rid = h.tel.arrival(RequestInfo(f"r{i}", 5, lora_name=f"adapter-{i}"))
        h.at(t).queued(rid)
        if prev is not None:
            h.rec.finished(prev, FinishReason.STOP)
        h.rec.snapshot(SchedulerSnapshot(1, 0, 0.0))
        h.step(t, t)
        prev = rid


def overflow_counts(text: str) -> dict[str, float]:
    return {d["metric"]: v for d, v in samples(text, "otel_llm_metric_overflow_measurements")}


def test_an_adapter_flood_stops_at_the_limit_plus_the_overflow_series():
    h = Harness(max_loras=4)  # default limit 2000
    assert h.tel.config.cardinality_limit == 2000
    flood(h, 5000)
    text = h.tel.render().decode()
    info = samples(text, INFO)
    assert len(info) == 2001
    assert [d["running_lora_adapters"] for d, _ in info[:2000]] == [f"adapter-{i}" for i in range(2000)]
    assert info[-1] == (OVERFLOW, wall_s(h.tel, S + 4999 * MS))  # the latest set
    assert overflow_counts(text) == {"otel_llm.lora.info": 3000}  # vllm profile: only what it shows
    otel = h.tel.render(profile="otel").decode()
    reqs = samples(otel, "otel_llm_lora_requests")
    assert len(reqs) == 2001 and reqs[-1] == (OVERFLOW, 3000.0)
    assert [d["otel_llm_lora_adapter"] for d, _ in reqs[:2000]] == [f"adapter-{i}" for i in range(2000)]
    assert sum(v for _, v in reqs) == 5000  # the total stays right
    assert overflow_counts(otel) == {"otel_llm.lora.requests": 3000}
    assert len(h.tel.lora.live) == 1  # memory: live requests only, and `limit` series per instrument
    snap = h.tel.lora_snapshot()
    assert len(snap.info) == len(snap.requests) == 2000
    # the same in OTLP
    reader = InMemoryMetricReader()
    h.tel.attach_reader(reader)
    metrics = {m.name: m for rm in reader.get_metrics_data().resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics}
    points = metrics["otel_llm.lora.requests"].data.data_points
    assert len(points) == 2001
    assert [dict(p.attributes) for p in points if "otel.metric.overflow" in p.attributes] == \
        [{"otel.metric.overflow": True}]
    assert next(p.value for p in points if "otel.metric.overflow" in p.attributes) == 3000
    assert {p.attributes["otel_llm.lora.adapter"] for p in points if "otel_llm.lora.adapter" in p.attributes} == \
        {f"adapter-{i}" for i in range(2000)}
    measured = metrics["otel_llm.metric.overflow.measurements"].data.data_points
    assert {p.attributes["metric"]: p.value for p in measured} == {"otel_llm.lora.info": 3000,
                                                                   "otel_llm.lora.requests": 3000}
    assert "otel_llm.lora.info" not in metrics  # a vLLM exposition artefact


def test_the_limit_is_configurable_and_validated():
    h = Harness(max_loras=4, cardinality_limit=3)
    flood(h, 5)
    assert len(samples(h.tel.render().decode(), INFO)) == 4
    assert overflow_counts(h.tel.render(profile="otel").decode()) == {"otel_llm.lora.requests": 2}
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match=f"cardinality_limit must be an int >= 1, got {bad!r}"):
            TelemetryConfig("m", cardinality_limit=bad)
    with pytest.raises(ValueError, match="max_loras must be an int >= 0, got -1"):
        TelemetryConfig("m", max_loras=-1)


def test_promtool_is_clean_past_the_limit():
    h = Harness(max_loras=4, cardinality_limit=5)
    flood(h, 12)
    assert promtool_check_metrics(h.tel.render(profile="otel").decode()) == []
    findings = promtool_check_metrics(h.tel.render().decode())
    unexplained = [f for f in findings if "should not contain ':'" not in f
                   and f != 'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix']
    assert unexplained == []


# -- cardinality limits: model names across Telemetries ------------------------------------


def _model(name: str, finished: int, running: int, max_model_len: int = 8192, limit: int = 3) -> Telemetry:
    tel = Telemetry(TelemetryConfig(name, log_stats=False, tracing=False, max_model_len=max_model_len,
                                    cardinality_limit=limit, cache_config={"block_size": 16}))
    rec = StepRecorder(clock=lambda: S)
    rids = [tel.arrival(RequestInfo(f"{name}-{i}", 100 * (i + 1), arrival_ns=0)) for i in range(finished)]
    for rid in rids:
        rec.finished(rid, FinishReason.LENGTH)
    rec.snapshot(SchedulerSnapshot(running=running, waiting=0, kv_usage=0.5))
    tel.ingest(rec.end_step_bytes())
    return tel


def test_a_model_name_flood_across_telemetries_is_bounded():
    tels = [_model(f"m{i}", finished=i + 1, running=10 + i, max_model_len=8192 if i % 2 else 1000) for i in range(10)]
    renderer = Renderer(get_profile("vllm"), 3)
    text = renderer.render([t.source() for t in tels]).decode()
    running = samples(text, "vllm:num_requests_running")
    assert running == [({"model_name": f"m{i}", "engine": "0"}, 10 + i) for i in range(3)] + [(OVERFLOW, 19)]
    success = {tuple(d.items()): v for d, v in samples(text, "vllm:request_success")}
    assert {dict(k).get("model_name") for k in success} == {"m0", "m1", "m2", None}
    assert success[tuple(OVERFLOW.items())] == sum(range(4, 11))  # every folded request, labels dropped
    # histograms of Telemetries with different bounds fold onto the bounds they share, exactly
    prompt = {(d.get("model_name"), d.get("le")): v for d, v in samples(text, "vllm:request_prompt_tokens")
              if "le" in d}
    want = sum(sum(1 for k in range(i + 1) if 100 * (k + 1) <= 500) for i in range(3, 10))
    assert prompt[(None, "500.0")] == want and prompt[(None, "+Inf")] == sum(range(4, 11))
    assert (None, "5000.0") not in prompt  # not a bound of the max_model_len=1000 tables
    assert overflow_counts(text)["otel_llm.request.finished"] == 7
    assert overflow_counts(renderer.render([t.source() for t in tels]).decode())["otel_llm.request.finished"] == 14
    # memory: prefixes are cached for `limit` base label sets and the overflow series, however many come
    cached = len(renderer._cache)
    more = tels + [_model(f"x{i}", 1, 1) for i in range(40)]
    text = renderer.render([t.source() for t in more]).decode()
    assert len(renderer._cache) == cached
    assert {d.get("model_name") for d, _ in samples(text, "vllm:num_requests_running")} == {"m0", "m1", "m2", None}
    unexplained = [f for f in promtool_check_metrics(text) if "should not contain ':'" not in f
                   and f != 'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix']
    assert unexplained == []


@pytest.mark.parametrize("profile,model_label", [("otel", "gen_ai_request_model"), ("sglang", "model_name"),
                                                 ("triton", "model"), ("tgi", None)])
def test_every_profile_bounds_model_names_with_one_overflow_series_per_family(profile, model_label):
    """Overflow series keep only a family's fixed labels (Triton's `request_type`, ...), so they never
    collide. (TGI has no model label: one model per exposition, as TGI.)"""
    tels = [_model(f"m{i}", finished=2, running=1) for i in range(6)]
    text = Renderer(get_profile(profile), 3).render([t.source() for t in tels]).decode()
    overflow, models = [], set()
    for fam in parse_text(text):
        for s in fam.samples:
            if s.labels.get("otel_metric_overflow") == "true":
                overflow.append((s.name, tuple(sorted(s.labels.items()))))
            elif model_label in s.labels:
                models.add(s.labels[model_label])
    assert overflow and len(overflow) == len(set(overflow))
    assert models == ({"m0", "m1", "m2"} if model_label else set())
    if profile == "otel":
        assert promtool_check_metrics(text) == []


def _points(data) -> dict[str, list]:
    """A collection's data points by metric name."""
    points = defaultdict(list)
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points[m.name].extend(m.data.data_points)
    return points


def test_an_otlp_reader_bounds_model_names_too():
    tels = [_model(f"m{i}", finished=i + 1, running=i, limit=2000) for i in range(5)]
    reader = InMemoryMetricReader()
    attach_reader(reader, tels)
    points = _points(reader.get_metrics_data())
    assert {p.attributes.get("gen_ai.request.model") for p in points["otel_llm.request.finished"]} == \
        {f"m{i}" for i in range(5)}  # default limit: all of them
    reader = InMemoryMetricReader()
    tels = [_model(f"m{i}", finished=i + 1, running=i, limit=2) for i in range(5)]
    attach_reader(reader, tels)
    for _ in range(2):
        data = reader.get_metrics_data()
    points = _points(data)
    finished = points["otel_llm.request.finished"]
    assert {p.attributes.get("gen_ai.request.model") for p in finished} == {"m0", "m1", None}
    over = [p for p in finished if "otel.metric.overflow" in p.attributes]
    assert [dict(p.attributes) for p in over] == [{"otel.metric.overflow": True}] and over[0].value == 3 + 4 + 5
    running = [p for p in points["otel_llm.scheduler.running"] if "otel.metric.overflow" in p.attributes]
    assert [p.value for p in running] == [4]  # last value
    e2e = [p for p in points["gen_ai.server.request.duration"] if "otel.metric.overflow" in p.attributes]
    assert [p.count for p in e2e] == [12]
    measured = {p.attributes["metric"]: p.value for p in points["otel_llm.metric.overflow.measurements"]}
    assert measured["otel_llm.request.finished"] == 6  # 3 folded Telemetries, 2 collections


# -- attributes with fixed vocabularies --------------------------------------------------------


def test_finish_reasons_and_operations_from_outside_keep_their_vocabulary(h):
    """A custom engine's finish reason beyond FinishReason counts as `error`; an unknown operation
    is `_OTHER`: no new series, whatever comes in."""
    rid = h.tel.arrival(RequestInfo("r", 5, operation="summarize-v7"))
    e = np.array([], np.int64)
    h.tel.ingest(StepRecord(S, 0, 0, 0, e, e, e, np.array([], np.uint8), e, np.array([], np.int32),
                            np.array([rid], np.int64), np.array([250], np.uint8), np.array([0], np.int32)))
    got = samples(h.tel.render(profile="otel").decode(), "otel_llm_request_finished")
    assert got == [({"gen_ai_request_model": "m", "otel_llm_engine": "0", "gen_ai_operation_name": "_OTHER",
                     "otel_llm_stream": "false", "otel_llm_finish_reason": "error"}, 1.0)]
