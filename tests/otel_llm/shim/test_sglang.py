"""The `sglang` profile against SGLang 0.5.23's own definitions: every family it claims has
SGLang's exact name, type, label names and order, buckets and HELP (from the AST extract of
`python/sglang/srt/observability/metrics_collector.py`, `data/sglang-metric-defs.tsv`, a copy
of shared/reference); values exact through a hand-driven Telemetry; promtool."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path
from typing import NamedTuple

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from otel_llm import FinishReason, RequestInfo
from otel_llm.canonical.instruments import Kind, instrument_table
from otel_llm.engine.step import SchedulerSnapshot
from otel_llm.shim.profiles import get_profile
from tests.harness.prometheus import promtool_check_metrics
from tests.otel_llm.conftest import Harness

DEFS = Path(__file__).parents[1] / "data/sglang-metric-defs.tsv"
COLLECTOR = "srt/observability/metrics_collector.py"
# metrics_collector.py (sglang 0.5.23 wheel): the two collector classes' line spans and their `labels`.
SCHEDULER = range(334, 1804)  # class SchedulerMetricsCollector; labels built in init_new (l. 1364-1370)
TOKENIZER = range(1822, 2190)  # class TokenizerMetricsCollector; labels from tokenizer_metric_labels (l. 1804)
SCHEDULER_LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
TOKENIZER_LABELS = ["model_name", "engine_type"]
# The bucket defaults the extract names but does not spell out (same file):
PROMPT_TOKENS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500,
                 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000,
                 300000, 400000, 600000, 800000, 1000000, 1100000]  # l. 1871 default_bucket_prompt_tokens
DEFAULT_BUCKETS = {
    # generate_buckets(None, default) = sorted(set(default)) (observability/utils.py l. 34)
    "generate_buckets(get_observability().prompt_tokens_buckets, default_bucket_prompt_tokens)": PROMPT_TOKENS,
    "generate_buckets(get_observability().generation_tokens_buckets, default_bucket_prompt_tokens)": PROMPT_TOKENS,
    "bucket_time_to_first_token": [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200,
                                   400],  # l. 1966
    "bucket_e2e_request_latency": [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
                                   600, 1200, 1800, 2400],  # l. 1988
    "bucket_inter_token_latency": [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035,
                                   0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000,
                                   4.000, 6.000, 8.000],  # l. 2014
}
S, MS = 1_000_000_000, 1_000_000
GIE = ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage")


class Def(NamedTuple):
    """One `metrics_collector.py` definition as the extract writes it (expressions, unevaluated:
    long docs are cut there, so only the claimed families' are read)."""

    line: int
    kind: str  # "counter" | "gauge" | "histogram"
    labels_expr: str
    buckets_expr: str
    doc_expr: str

    @property
    def labels(self) -> list[str]:
        """`labels.keys()`, `list(labels.keys()) + ['x']`, `[*labels.keys(), 'x']` -> names, in order."""
        assert "labels.keys()" in self.labels_expr, self.labels_expr
        base = SCHEDULER_LABELS if self.line in SCHEDULER else TOKENIZER_LABELS if self.line in TOKENIZER else None
        assert base is not None, f"line {self.line}: in neither collector"
        return base + re.findall(r"'(\w+)'", self.labels_expr)

    @property
    def buckets(self) -> list[float]:
        return [float(b) for b in DEFAULT_BUCKETS.get(self.buckets_expr) or ast.literal_eval(self.buckets_expr)]

    @property
    def doc(self) -> str:
        return ast.literal_eval(self.doc_expr)


def sglang_defs() -> dict[str, Def]:
    """Exposed sample name (counters with `_total`) -> its definition, for metrics_collector.py."""
    out = {}
    for row in DEFS.read_text().splitlines():
        where, kind, name, labels, buckets, _mp, doc = row.split("\t")
        path, line = where.rsplit(":", 1)
        if path == COLLECTOR and name.startswith("'"):
            out[ast.literal_eval(name)] = Def(int(line), kind.lower(), labels.removeprefix("labels="),
                                              buckets.removeprefix("buckets="), doc.removeprefix("doc="))
    return out


def exposed(fam, table) -> str:
    return fam.name + ("_total" if fam.kind(table[fam.canonical]) is Kind.COUNTER else "")


def workload(h: Harness) -> None:
    """3 streamed + 2 non-streamed requests; one streamed one aborted after 2 tokens.

    Engine: queued at 1 s, scheduled 2 ms later; outputs at +10, +36, +71 ms. Frontend: arrival at
    1 s, the outputs received at +300, +330, +360 ms (TTFT 0.3 s, e2e 0.33 s / 0.36 s)."""
    prompts = {True: (150, 250, 2000), False: (50, 320)}
    rids = []
    for stream, sizes in prompts.items():
        for i, n in enumerate(sizes):
            h.fclock.t = S
            rid = h.tel.arrival(RequestInfo(f"{stream}{i}", n, "chat", max_tokens=3, stream=stream))
            h.at(S).queued(rid)
            h.at(S + 2 * MS).scheduled(rid)
            rids.append(rid)
    aborted = rids[2]
    h.at(S + 10 * MS).outputs(rids, 1)
    h.rec.snapshot(SchedulerSnapshot(running=5, waiting=0, kv_usage=0.25, prefix_queries=2770, prefix_hits=640,
                                     preemptions=1))
    h.step(S + 10 * MS, S + 300 * MS)
    h.at(S + 36 * MS).outputs(rids, 1)
    h.rec.finished(aborted, FinishReason.ABORT)
    h.step(S + 36 * MS, S + 330 * MS)
    rest = [r for r in rids if r != aborted]
    h.at(S + 71 * MS).outputs(rest, 1)
    for r in rest:
        h.rec.finished(r, FinishReason.LENGTH)
    h.rec.snapshot(SchedulerSnapshot(running=1, waiting=2, kv_usage=0.5))
    h.step(S + 71 * MS, S + 360 * MS)


def harness() -> Harness:
    return Harness(cache_config={"block_size": 16, "num_gpu_blocks": 1024, "enable_prefix_caching": True})


@pytest.fixture
def text():
    h = harness()
    workload(h)
    return h.tel.render(profile="sglang").decode()


def samples(text: str) -> dict[str, dict[tuple, float]]:
    """{sample name: {((label, value), ...) in exposition order: value}}."""
    out: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.fullmatch(r"([^{ ]+)(?:\{(.*)\})? (\S+)", line)
        assert m, line
        pairs = tuple(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out.setdefault(m.group(1), {})[pairs] = float(m.group(3))
    return out


def test_every_family_is_sglangs_exactly(text):
    defs, table = sglang_defs(), instrument_table(8192)
    got = samples(text)
    profile = get_profile("sglang")
    assert len({f.name for f in profile.families}) == len(profile.families)
    for fam in profile.families:
        name = exposed(fam, table)
        d = defs.get(name)
        assert d is not None, f"{name}: not in SGLang's metrics_collector.py"
        assert f"# TYPE {name} {d.kind}" in text.splitlines(), name
        assert f"# HELP {name} {d.doc}" in text.splitlines(), name
        series = got.get(name + "_bucket" if d.kind == "histogram" else name)
        assert series, f"{name}: no samples"
        for pairs in series:
            assert [k for k, _ in pairs if k != "le"] == d.labels, (name, pairs)
        if d.kind == "histogram":
            first = next(iter(series))[:-1]  # one series' bucket lines: its labels without `le`
            les = [float(dict(p)["le"]) for p in series if p[:-1] == first]
            assert les == d.buckets + [math.inf], name
            assert name + "_sum" in got and name + "_count" in got


def test_gie_families_are_there_as_gauges(text):
    for name in GIE:
        assert f"# TYPE {name} gauge" in text


def test_label_values_are_sglangs(text):
    got = samples(text)
    values: dict[str, set[str]] = {}
    for series in got.values():
        for pairs in series:
            for k, v in pairs:
                values.setdefault(k, set()).add(v)
    assert values["is_streaming"] == {"true", "false"}  # SGLang: "true" if is_streaming else "false"
    assert values["engine_type"] == {"unified"}
    assert values["tp_rank"] == values["pp_rank"] == values["moe_ep_rank"] == {"0"}
    assert values["cache_source"] == {"device"}
    assert values["model_name"] == {"m"}


def test_values_exact(text):
    got = samples(text)
    tok = (("model_name", "m"), ("engine_type", "unified"))
    sched = tok + (("tp_rank", "0"), ("pp_rank", "0"), ("moe_ep_rank", "0"))
    true, false = tok + (("is_streaming", "true"),), tok + (("is_streaming", "false"),)

    def one(name, labels):
        return got[name][labels]

    assert one("sglang:num_requests_total", true) == 3 and one("sglang:num_requests_total", false) == 2
    assert one("sglang:prompt_tokens_total", true) == 2400 and one("sglang:prompt_tokens_total", false) == 370
    assert one("sglang:generation_tokens_total", true) == 8 and one("sglang:generation_tokens_total", false) == 6
    assert one("sglang:num_aborted_requests_total", tok) == 1
    assert one("sglang:cached_tokens_total", tok + (("cache_source", "device"),)) == 640
    assert one("sglang:num_retracted_requests_total", sched) == 1
    assert one("sglang:num_running_reqs", sched) == 1 and one("sglang:num_queue_reqs", sched) == 2
    assert one("sglang:token_usage", sched) == 0.5 == one("sglang:full_token_usage", sched)
    assert one("sglang:page_size", sched) == 16 and one("sglang:num_pages", sched) == 1024
    assert one("sglang:max_total_num_tokens", sched) == 16 * 1024

    def buckets(name, labels):
        return {float(dict(p)["le"]): v for p, v in got[name + "_bucket"].items() if p[:-1] == labels}

    prompt = buckets("sglang:prompt_tokens_histogram", tok)  # 50, 150, 250, 320, 2000
    assert (prompt[100], prompt[300], prompt[500], prompt[1500], prompt[2000]) == (1, 3, 4, 4, 5)
    assert one("sglang:prompt_tokens_histogram_sum", tok) == 2770
    gen = buckets("sglang:generation_tokens_histogram", tok)
    assert gen[100] == 5 and one("sglang:generation_tokens_histogram_sum", tok) == 14
    for labels, n in ((true, 3), (false, 2)):
        ttft = buckets("sglang:time_to_first_token_seconds", labels)  # 0.3 s each
        assert (ttft[0.2], ttft[0.4], ttft[math.inf]) == (0, n, n)
        e2e = buckets("sglang:e2e_request_latency_seconds", labels)  # 0.33 s (the abort) and 0.36 s
        assert (e2e[0.2], e2e[0.4]) == (0, n)
        assert one("sglang:e2e_request_latency_seconds_count", labels) == n
    assert one("sglang:e2e_request_latency_seconds_sum", true) == pytest.approx(0.33 + 2 * 0.36)
    queue = buckets("sglang:queue_time_seconds", sched)  # 2 ms each
    assert (queue[0.0], queue[0.001], queue[0.005]) == (0, 0, 5)
    itl = buckets("sglang:inter_token_latency_seconds", tok)  # 5 x 26 ms, then 4 x 35 ms
    assert (itl[0.025], itl[0.03], itl[0.035], itl[math.inf]) == (0, 5, 9, 9)
    assert one("sglang:inter_token_latency_seconds_sum", tok) == pytest.approx(5 * 0.026 + 4 * 0.035)
    tpot = buckets("sglang:request_time_per_output_token_seconds", false)  # (71 - 10) ms / 2 each
    assert (tpot[0.03], tpot[0.035]) == (0, 2)


def test_parses_in_both_formats():
    h = harness()
    workload(h)
    names = {f.name for f in parse_text(h.tel.render(profile="sglang").decode())}
    om = {f.name for f in parse_openmetrics(h.tel.render(openmetrics=True, profile="sglang").decode())}
    assert "sglang:num_requests" in om and "sglang:e2e_request_latency_seconds" in om
    assert {n.removesuffix("_total") for n in names} == om


def test_promtool_only_sglangs_own_naming(text):
    findings = promtool_check_metrics(text)
    own = {f"sglang:{t}_tokens_histogram metric name should not include type 'histogram'"
           for t in ("prompt", "generation")}
    assert [f for f in findings if "should not contain ':'" not in f and f not in own] == []


def test_cache_constants_only_with_a_cache_config(h):
    workload(h)
    text = h.tel.render(profile="sglang").decode()
    assert "sglang:num_running_reqs{" in text
    assert not any(f"sglang:{name}" in text for name in ("page_size", "num_pages", "max_total_num_tokens"))
