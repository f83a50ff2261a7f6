"""Goodput: finished requests judged against the SLO file's objectives, counted by what they missed,
and shown (on /metrics under every profile, in OTLP) only where objectives are configured."""

import logging

import numpy as np
import pytest

from otel_llm import FinishReason, RequestInfo
from otel_llm.canonical.instruments import SLO_MISSED
from otel_llm.export.metric_producer import to_metrics
from otel_llm.frontend.config import TelemetryConfig
from otel_llm.shim.profiles import PROFILE_NAMES
from otel_llm.slo.config import SloConfigError, parse_slo_config
from otel_llm.slo.goodput import GOODPUT, Goodput
from tests.otel_llm.conftest import Harness

MS = 1_000_000
SLO = parse_slo_config({"objectives": [
    {"model": "m", "ttft": {"threshold": 0.05, "target": 0.99}, "tpot": {"threshold": 0.01, "target": 0.95},
     "e2e": {"threshold": 0.2, "target": 0.99}, "errors": {"target": 0.999}},
]})


@pytest.fixture(params=["with spans", "batched"])
def make(request):
    def build(slo=SLO, **config):
        if request.param == "batched":
            config.update(tracer_provider=None, tracing=False)
        return Harness(slo=slo, **config)
    return build


class Driver:
    """Runs requests one after another on a Harness's clocks: arrival, queued and scheduled 1 ms later,
    the first token `ttft_ms` after arrival, then one token per gap."""

    def __init__(self, h: Harness):
        self.h, self.t = h, 0

    def request(self, ttft_ms: float | None, gaps_ms=(), reason=FinishReason.STOP, op="chat", lora=None):
        h, t0 = self.h, self.t
        self.t += 10_000 * MS
        f0, e0 = 1_000 * MS + t0, 50_000 * MS + t0
        h.fclock.t = f0
        rid = h.tel.arrival(RequestInfo(f"r{t0}", prompt_tokens=4, operation=op, lora_name=lora))
        h.at(e0).queued(rid)
        h.at(e0 + MS).scheduled(rid, 0)
        h.step(e0 + MS, f0 + MS)
        if ttft_ms is None:  # never got a token: the frontend ends it
            h.fclock.t = f0 + 2 * MS
            h.tel.fail(rid, reason)
            return
        t = int(ttft_ms * MS)
        h.at(e0 + t).outputs([rid], 1)
        if not gaps_ms:
            h.rec.finished(rid, reason)
        h.step(e0 + t, f0 + t)
        for k, gap in enumerate(gaps_ms):
            t += int(gap * MS)
            h.at(e0 + t).outputs([rid], 1)
            if k == len(gaps_ms) - 1:
                h.rec.finished(rid, reason)
            h.step(e0 + t, f0 + t)


def missed_counts(h) -> dict[str, int]:
    c = h.counter(GOODPUT).reshape(-1, len(SLO_MISSED)).sum(axis=0)
    return {SLO_MISSED[i]: int(v) for i, v in enumerate(c) if v}


def test_each_request_counted_by_the_objectives_it_missed(make):
    h = make()
    d = Driver(h)
    d.request(40, (5, 5, 5))  # met every objective
    d.request(60, (5, 5))  # TTFT 60 ms > 50 ms
    d.request(40, (20, 20))  # TPOT 20 ms > 10 ms
    d.request(60, (50, 50, 50))  # TTFT, TPOT and e2e 210 ms > 200 ms
    d.request(None, reason=FinishReason.ERROR)  # an error before any token: only the errors objective
    d.request(40, (5,), reason=FinishReason.ABORT)  # a client's abort is not an error
    d.request(40)  # one token: no TPOT, not held against it
    d.request(10, (5,), reason=FinishReason.ERROR)  # fast, but in error
    assert missed_counts(h) == {"none": 3, "ttft": 1, "tpot": 1, "ttft+tpot+e2e": 1, "errors": 2}
    series = h.counter(GOODPUT).reshape(-1, len(SLO_MISSED))  # by (operation, stream): chat, not streamed
    assert series.sum(axis=1).nonzero()[0].tolist() == [0]


def test_the_most_specific_objective_set_judges_a_request(make):
    slo = parse_slo_config({"objectives": [
        {"ttft": {"threshold": 1.0, "target": 0.9}},  # any model
        {"model": "m", "operation": "chat", "ttft": {"threshold": 0.05, "target": 0.9}},
        {"model": "m", "lora_adapter": "sql", "ttft": {"threshold": 0.02, "target": 0.9}},
        {"model": "other", "ttft": {"threshold": 0.001, "target": 0.9}},  # not this model's
    ]})
    h = make(slo)
    d = Driver(h)
    d.request(60, (5,), op="text_completion")  # the any-model set: 60 ms <= 1 s
    d.request(60, (5,), op="chat")  # the chat set: missed
    d.request(30, (5,), op="chat", lora="sql")  # the adapter set (more specific than operation): missed
    d.request(30, (5,), op="chat", lora="other-adapter")  # no set for that adapter: the chat set, met
    assert missed_counts(h) == {"none": 2, "ttft": 2}


def test_requests_no_set_covers_are_not_counted(make, caplog):
    slo = parse_slo_config({"objectives": [{"model": "m", "operation": "chat", "e2e": {"threshold": 1, "target": 0.9}}]})
    h = make(slo)
    Driver(h).request(10, (5,), op="text_completion")
    assert missed_counts(h) == {}
    with caplog.at_level(logging.WARNING, "otel_llm"):
        make(parse_slo_config({"objectives": [{"model": "x", "e2e": {"threshold": 1, "target": 0.9}}]}))
    assert "no objectives for model 'm'" in caplog.text


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_goodput_family_only_with_objectives(profile):
    plain = Harness(tracing=False, tracer_provider=None)
    judged = Harness(tracing=False, tracer_provider=None, slo=SLO)
    for h in (plain, judged):
        Driver(h).request(60, (5,))
    assert b"otel_llm_slo" not in plain.tel.render(profile=profile)
    text = judged.tel.render(profile=profile).decode()
    label = "otel_llm_slo_missed" if profile == "otel" else "missed"
    suffix = "" if profile in ("tgi", "triton") else "_total"
    line = next(x for x in text.splitlines() if x.startswith(f"otel_llm_slo_requests{suffix}{{")
                and f'{label}="ttft"' in x)
    assert line.endswith(" 1.0") or line.endswith(" 1"), line


def test_goodput_in_otlp_only_with_objectives():
    plain = Harness(tracing=False, tracer_provider=None)
    judged = Harness(tracing=False, tracer_provider=None, slo=SLO)
    for h in (plain, judged):
        Driver(h).request(40, (5,))
    assert GOODPUT not in {m.name for m in to_metrics(plain.tel)}
    metric = next(m for m in to_metrics(judged.tel) if m.name == GOODPUT)
    [point] = metric.data.data_points
    assert point.value == 1 and point.attributes["otel_llm.slo.missed"] == "none"
    assert point.attributes["gen_ai.operation.name"] == "chat"


def test_config_takes_a_file_and_names_a_bad_value(tmp_path):
    path = tmp_path / "slo.yaml"
    path.write_text("objectives:\n  - model: m\n    ttft: {threshold: 0.5, target: 0.99}\n")
    assert TelemetryConfig("m", slo=str(path)).slo.sets[0].objectives[0].threshold == 0.5
    path.write_text("objectives:\n  - model: m\n    ttft: {threshold: -1, target: 0.99}\n")
    with pytest.raises(SloConfigError, match=r"objectives\[0\].ttft.threshold: must be a positive number"):
        TelemetryConfig("m", slo=path)
    with pytest.raises(SloConfigError, match="cannot read the SLO file"):
        TelemetryConfig("m", slo=str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="slo must be None, an SloConfig or the path"):
        TelemetryConfig("m", slo=3)


def test_goodput_judges_seconds_as_the_vllm_plugin_has_them():
    g = Goodput(SLO, "m", scale=1.0)
    counters = np.zeros(8 * len(SLO_MISSED))
    nan = np.nan
    g.count(counters, np.array([6, 6, 6]), np.array([0.04, nan, 0.06]), np.array([0.005, nan, 0.02]),
            np.array([0.1, 0.3, 0.1]), np.array([FinishReason.STOP, FinishReason.ERROR, FinishReason.LENGTH]))
    by = counters.reshape(8, -1)[6]
    assert {SLO_MISSED[i]: v for i, v in enumerate(by) if v} == {"none": 1, "e2e+errors": 1, "ttft+tpot": 1}
