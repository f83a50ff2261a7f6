"""The `tgi` and `triton` profiles against the servers' own sources, with exact values.

Facts below were read from: huggingface/text-generation-inference `db931fcf` (`router/src/server.rs`,
`router/src/validation.rs`, `router/src/infer/mod.rs`, `backends/v3/src/{backend,queue,lib}.rs`) with
metrics-exporter-prometheus 0.15.3 (`recorder.rs`: the first description of a name wins);
triton-inference-server/core `73aad7c` (`src/metrics.cc`, `src/metric_model_reporter.{h,cc}`,
`src/infer_stats.cc`); NVIDIA/TensorRT-LLM `0d5352f5`
`triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc`.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot
from otel_llm.engine.step import FINISH_REASON_LABELS
from tests.harness.prometheus import promtool_check_metrics
from tests.otel_llm.conftest import Harness

S, MS = 1_000_000_000, 1_000_000

# name: (type, labels besides the base ones, HELP as the server writes it; None: no HELP line)
TGI_FACTS = {
    "tgi_queue_size": ("gauge", set(), "Current queue size"),  # server.rs:2047; v3/queue.rs:143
    "tgi_batch_current_size": ("gauge", set(), "Current batch size"),  # server.rs:2042; v3/backend.rs:170
    # v3/lib.rs:138 sets it; server.rs:2053 describes "tgi_batch_total_tokens" instead: no HELP
    "tgi_batch_max_total_tokens": ("gauge", set(), None),
    "tgi_request_count": ("counter", set(), "Total number of requests"),  # server.rs:2032
    "tgi_request_success": ("counter", set(), "Number of successful requests"),  # server.rs:1996
    # never described; infer/mod.rs:117,125,237,313; v3/backend.rs:439,454,545; v3/queue.rs:282
    "tgi_request_failure": ("counter", {"err"}, None),
    "tgi_request_duration": ("histogram", set(), "Request duration"),  # server.rs:1997 (again at 2093)
    "tgi_request_queue_duration": ("histogram", set(), "Request queue duration"),  # server.rs:2007 (2083)
    "tgi_request_inference_duration": ("histogram", set(), "Request inference duration"),  # server.rs:2012
    "tgi_request_mean_time_per_token_duration": ("histogram", set(), "Mean time per token per request"),  # :2017
    "tgi_request_input_length": ("histogram", set(), "Input token length per request"),  # :2103; validation.rs:192
    "tgi_request_generated_tokens": ("histogram", set(), "Generated tokens per request"),  # server.rs:2022
    "tgi_request_max_new_tokens": ("histogram", set(), "Maximum new tokens per request"),  # :2058; validation.rs:433
}
TGI_ERR = {"validation", "overloaded", "template", "incomplete", "dropped", "generation"}
TGI_DURATIONS = {n for n in TGI_FACTS if n.endswith("duration")}  # server.rs:1938 Matcher::Suffix("duration")
TGI_LINEAR = {"tgi_request_input_length", "tgi_request_generated_tokens", "tgi_request_max_new_tokens"}  # :1949-1962

TRITON_FACTS = {
    "nv_inference_request_success": ("counter", set(), "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", {"reason"}, "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", set(), "Number of inferences performed (does not include cached requests)"),
    "nv_inference_exec_count": ("counter", set(),
                                "Number of model executions performed (does not include cached requests)"),
    "nv_inference_request_duration_us": (
        "counter", set(), "Cumulative inference request duration in microseconds (includes cached requests)"),
    "nv_inference_queue_duration_us": (
        "counter", set(), "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    "nv_inference_compute_input_duration_us": (
        "counter", set(), "Cumulative compute input duration in microseconds (does not include cached requests)"),
    "nv_inference_compute_infer_duration_us": (
        "counter", set(), "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    "nv_inference_pending_request_count": ("gauge", set(),
                                           "Instantaneous number of pending requests awaiting execution per-model."),
    "nv_inference_first_response_histogram_ms": ("histogram", set(),
                                                 "Duration from request to first response in milliseconds"),
    # custom_metrics_reporter.cc InitializeReporter: TritonMetricGroup(name, description, category label)
    "nv_trt_llm_request_metrics": ("gauge", {"request_type"}, "TRT LLM request metrics"),
    "nv_trt_llm_kv_cache_block_metrics": ("gauge", {"kv_cache_block_type"}, "TRT LLM KV cache block metrics"),
    "nv_llm_input_token_len": ("histogram", {"response_metric_type"}, "TRT LLM response metrics"),
    "nv_llm_output_token_len": ("histogram", {"response_metric_type"}, "TRT LLM response metrics"),
}  # core src/metrics.cc:52-157 (names, HELP, BuildCounter/BuildGauge/BuildHistogram)
TRITON_BASE = {"model", "version"}  # metric_model_reporter.cc GetMetricLabels (no namespace, no gpu_uuid here)
TRITON_REASONS = {"REJECTED", "CANCELED", "BACKEND", "OTHER"}  # metric_model_reporter.cc failure_reasons_map
TRT_REQUEST_TYPES = {"active", "max", "scheduled", "context", "waiting"}  # custom_metrics_reporter.cc request_labels_
TRT_KV_BLOCK_TYPES = {"max", "free", "used", "tokens_per", "reused", "fraction"}  # ... kv_cache_labels_
FIRST_RESPONSE_MS = [100.0, 500.0, 2000.0, 5000.0]  # metric_model_reporter.h:66 histogram_options_ default
TOKEN_LEN = [10.0, 50.0, 100.0, 500.0, 1000.0]  # custom_metrics_reporter.cc InitializeReporter `buckets`

# Findings `promtool check metrics` has about the servers' own names and HELP, nothing of ours.
TGI_PROMTOOL = {
    "tgi_batch_max_total_tokens no help text",
    'tgi_request_count counter metrics should have "_total" suffix',
    'tgi_request_count non-histogram and non-summary metrics should not have "_count" suffix',
    'tgi_request_failure counter metrics should have "_total" suffix',
    "tgi_request_failure no help text",
    'tgi_request_success counter metrics should have "_total" suffix',
}
TRITON_PROMTOOL = {
    *(f'{n} counter metrics should have "_total" suffix' for n, f in TRITON_FACTS.items() if f[0] == "counter"),
    *(f"{n} metric names should not contain abbreviated units" for n in TRITON_FACTS if n.endswith(("_us", "_ms"))),
    *(f'{n} non-histogram and non-summary metrics should not have "_count" suffix'
      for n in ("nv_inference_count", "nv_inference_exec_count", "nv_inference_pending_request_count")),
    "nv_inference_first_response_histogram_ms metric name should not include type 'histogram'",
}

_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# Per request: finish reason, prompt tokens, queue ms, prefill ms, TTFT ms (frontend); 4 tokens, 10 ms apart.
REQUESTS = [
    (FinishReason.LENGTH, 10, 1, 5, 50),
    (FinishReason.STOP, 100, 2, 10, 300),
    (FinishReason.LENGTH, 1000, 3, 15, 1000),
    (FinishReason.REPETITION, 4000, 4, 20, 3000),
    (FinishReason.STOP, 41, 5, 25, 6000),
    (FinishReason.ABORT, 40, 6, 30, 200),
    (FinishReason.ERROR, 82, 7, 35, 400),
]
SUCCESS = [r for r in REQUESTS if r[0] in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.REPETITION)]
DECODE_MS = 30


def parse(text: str) -> dict[str, dict]:
    """{family: {"type", "help", "samples": [(sample name, {label: value}, value)]}} (text format 0.0.4)."""
    fams: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            fams.setdefault(name, {"type": None, "help": None, "samples": []})["help"] = help_text
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert fams.get(name, {}).get("type") is None, f"second TYPE line for {name}"
            current = fams.setdefault(name, {"type": None, "help": None, "samples": []})
            current["type"] = kind
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m, line
            assert m.group(1).startswith(tuple(fams)), f"sample outside its family: {line}"
            current["samples"].append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return fams


def value(fams: dict, sample: str, **labels: str) -> float:
    """The one sample named `sample` whose labels include `labels`."""
    family = sample if sample in fams else re.sub(r"_(bucket|sum|count)$", "", sample)
    hits = [v for n, lab, v in fams[family]["samples"] if n == sample and labels.items() <= lab.items()]
    assert len(hits) == 1, (sample, labels, hits)
    return hits[0]


def buckets(fams: dict, family: str, **labels: str) -> list[tuple[float, float]]:
    """[(le, cumulative count)] of one histogram series, +Inf last."""
    return [(float(lab["le"]), v) for n, lab, v in fams[family]["samples"]
            if n == family + "_bucket" and labels.items() <= lab.items()]


def drive(h: Harness) -> None:
    """REQUESTS one after another, then a scheduler snapshot: running 3, waiting 2, KV usage 0.25."""
    for i, (reason, prompt, queue_ms, prefill_ms, ttft_ms) in enumerate(REQUESTS):
        f0, e0 = (1 + 100 * i) * S, (50 + 100 * i) * S
        h.fclock.t = f0
        rid = h.tel.arrival(RequestInfo(f"r{i}", prompt, "chat", max_tokens=16))
        h.at(e0).queued(rid)
        h.at(e0 + queue_ms * MS).scheduled(rid)
        h.step(e0 + queue_ms * MS, f0 + 1 * MS)
        first = e0 + (queue_ms + prefill_ms) * MS
        h.at(first).outputs([rid], 1)
        h.step(first, f0 + ttft_ms * MS, prompt_tokens=prompt)
        for k in (1, 2, 3):
            h.at(first + 10 * k * MS).outputs([rid], 1)
            if k == 3:
                h.rec.finished(rid, reason, max_seq_tokens=16)
                h.rec.snapshot(SchedulerSnapshot(running=3, waiting=2, kv_usage=0.25))
            h.step(first + 10 * k * MS, f0 + (ttft_ms + 10 * k) * MS)
    assert sum(h.dropped().values()) == 0


def e2e_s(requests) -> float:
    return sum(ttft + DECODE_MS for *_, ttft in requests) / 1e3


@pytest.fixture
def driven() -> Harness:
    h = Harness(cache_config={"block_size": 16, "num_gpu_blocks": 1000}, max_model_len=4096, model_version="3")
    drive(h)
    return h


def _check_facts(fams: dict, facts: dict, base: set[str]) -> None:
    assert set(fams) == set(facts)
    for name, (kind, extra, help_text) in facts.items():
        fam = fams[name]
        assert (fam["type"], fam["help"]) == (kind, help_text), name
        assert fam["samples"], name
        for sample, labels, _ in fam["samples"]:
            assert set(labels) - {"le"} == base | extra, (name, sample, labels)
            assert ("le" in labels) == sample.endswith("_bucket")


def test_tgi_families_are_the_routers(driven):
    fams = parse(driven.tel.render(profile="tgi").decode())
    _check_facts(fams, TGI_FACTS, set())
    assert {lab["err"] for _, lab, _ in fams["tgi_request_failure"]["samples"]} == {"dropped", "generation"} < TGI_ERR
    geometric, v = [], 0.0001  # server.rs:1940-1946: value *= 1.5, 35 times
    for _ in range(35):
        v *= 1.5
        geometric.append(v)
    assert geometric[:2] == [0.00015000000000000001, 0.00022500000000000003]
    linear = [(4096 / 100.0) * (x + 1) for x in range(100)]  # server.rs:1950-1962, max_model_len for both limits
    for name in TGI_DURATIONS | TGI_LINEAR:
        les = [le for le, _ in buckets(fams, name)]
        assert les == (geometric if name in TGI_DURATIONS else linear) + [math.inf], name


def test_triton_families_are_tritons_and_the_trt_llm_backends(driven):
    fams = parse(driven.tel.render(profile="triton").decode())
    _check_facts(fams, TRITON_FACTS, TRITON_BASE)
    values = {name: {lab.get(label) for _, lab, _ in fams[name]["samples"]}
              for name, label in (("nv_inference_request_failure", "reason"),
                                  ("nv_trt_llm_request_metrics", "request_type"),
                                  ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type"))}
    assert values["nv_inference_request_failure"] == {"CANCELED", "BACKEND"} < TRITON_REASONS
    assert values["nv_trt_llm_request_metrics"] == {"waiting", "scheduled"} < TRT_REQUEST_TYPES
    assert values["nv_trt_llm_kv_cache_block_metrics"] == {"fraction", "tokens_per", "max"} < TRT_KV_BLOCK_TYPES
    assert [le for le, _ in buckets(fams, "nv_inference_first_response_histogram_ms")] == FIRST_RESPONSE_MS + [math.inf]
    for name in ("nv_llm_input_token_len", "nv_llm_output_token_len"):
        assert [le for le, _ in buckets(fams, name)] == TOKEN_LEN + [math.inf]
    assert {lab["model"] for _, lab, _ in fams["nv_inference_count"]["samples"]} == {"m"}
    assert {lab["version"] for _, lab, _ in fams["nv_inference_count"]["samples"]} == {"3"}


def test_tgi_values(driven):
    fams = parse(driven.tel.render(profile="tgi").decode())
    assert value(fams, "tgi_request_count") == len(REQUESTS)
    assert value(fams, "tgi_request_success") == len(SUCCESS)
    assert value(fams, "tgi_request_failure", err="dropped") == 1
    assert value(fams, "tgi_request_failure", err="generation") == 1
    assert value(fams, "tgi_request_duration_count") == len(SUCCESS)  # successes only, as TGI
    assert math.isclose(value(fams, "tgi_request_duration_sum"), e2e_s(SUCCESS), rel_tol=1e-12)
    assert value(fams, "tgi_request_queue_duration_count") == len(REQUESTS)
    assert math.isclose(value(fams, "tgi_request_queue_duration_sum"), sum(r[2] for r in REQUESTS) / 1e3)
    assert math.isclose(value(fams, "tgi_request_inference_duration_sum"),
                        sum(r[3] + DECODE_MS for r in REQUESTS) / 1e3)
    assert math.isclose(value(fams, "tgi_request_mean_time_per_token_duration_sum"), len(REQUESTS) * 0.010)
    prompts = [r[1] for r in REQUESTS]
    assert buckets(fams, "tgi_request_input_length") == [(le, sum(p <= le for p in prompts))
                                                         for le, _ in buckets(fams, "tgi_request_input_length")]
    assert buckets(fams, "tgi_request_input_length")[0] == (40.96, 2)
    assert value(fams, "tgi_request_generated_tokens_sum") == 4 * len(REQUESTS)
    assert value(fams, "tgi_request_max_new_tokens_sum") == 16 * len(REQUESTS)
    assert value(fams, "tgi_queue_size") == 2 and value(fams, "tgi_batch_current_size") == 3
    assert value(fams, "tgi_batch_max_total_tokens") == 16 * 1000


def test_triton_values(driven):
    fams = parse(driven.tel.render(profile="triton").decode())
    assert value(fams, "nv_inference_request_success", model="m", version="3") == len(SUCCESS)
    assert value(fams, "nv_inference_count") == len(SUCCESS)
    assert value(fams, "nv_inference_request_failure", reason="CANCELED") == 1
    assert value(fams, "nv_inference_request_failure", reason="BACKEND") == 1
    assert value(fams, "nv_inference_exec_count") == 4 * len(REQUESTS)  # the steps that computed tokens
    e2e = driven.tel.snapshot().histograms["gen_ai.server.request.duration"]
    ok = np.array([r in ("stop", "length", "repetition") for r in FINISH_REASON_LABELS])
    assert math.isclose(value(fams, "nv_inference_request_duration_us"),
                        e2e.sums.reshape(-1, len(ok))[:, ok].sum() * 1e6)
    assert math.isclose(value(fams, "nv_inference_request_duration_us"), e2e_s(SUCCESS) * 1e6)
    us = {"nv_inference_queue_duration_us": sum(r[2] for r in REQUESTS) * 1e3,  # every request with engine times
          "nv_inference_compute_input_duration_us": sum(r[3] for r in REQUESTS) * 1e3,
          "nv_inference_compute_infer_duration_us": len(REQUESTS) * DECODE_MS * 1e3}
    for name, expected in us.items():
        assert math.isclose(value(fams, name), expected), name
    ttft = [r[4] for r in REQUESTS]
    assert buckets(fams, "nv_inference_first_response_histogram_ms") == [
        (le, sum(t <= le for t in ttft)) for le in FIRST_RESPONSE_MS + [math.inf]]
    assert [c for _, c in buckets(fams, "nv_inference_first_response_histogram_ms")] == [1, 4, 5, 6, 7]
    assert math.isclose(value(fams, "nv_inference_first_response_histogram_ms_sum"), sum(ttft))
    assert value(fams, "nv_inference_pending_request_count") == 2
    assert value(fams, "nv_trt_llm_request_metrics", request_type="waiting") == 2
    assert value(fams, "nv_trt_llm_request_metrics", request_type="scheduled") == 3
    assert value(fams, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction") == 0.25
    assert value(fams, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per") == 16
    assert value(fams, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max") == 1000
    prompts = [r[1] for r in REQUESTS]
    assert buckets(fams, "nv_llm_input_token_len") == [(le, sum(p <= le for p in prompts))
                                                       for le in TOKEN_LEN + [math.inf]]
    assert [c for _, c in buckets(fams, "nv_llm_output_token_len")] == [len(REQUESTS)] * 6  # 4 tokens each


def test_cache_config_gauges_are_left_out_while_unknown():
    """The server passes num_gpu_blocks="" until the engine has sized its cache."""
    h = Harness(cache_config={"block_size": 16, "num_gpu_blocks": ""})
    triton = parse(h.tel.render(profile="triton").decode())
    kinds = {lab["kv_cache_block_type"] for _, lab, _ in triton["nv_trt_llm_kv_cache_block_metrics"]["samples"]}
    assert kinds == {"fraction", "tokens_per"}
    assert parse(h.tel.render(profile="tgi").decode())["tgi_batch_max_total_tokens"]["samples"] == []


def test_tgi_writes_only_touched_series_and_triton_every_one():
    """metrics-exporter-prometheus renders what was recorded; Triton creates per-model series at load."""
    h = Harness()
    tgi = parse(h.tel.render(profile="tgi").decode())
    assert all(not f["samples"] for n, f in tgi.items() if n not in ("tgi_queue_size", "tgi_batch_current_size"))
    triton = parse(h.tel.render(profile="triton").decode())
    assert value(triton, "nv_inference_request_success") == 0
    assert value(triton, "nv_inference_request_failure", reason="CANCELED") == 0


@pytest.mark.parametrize("profile, allowed", [("tgi", TGI_PROMTOOL), ("triton", TRITON_PROMTOOL)])
def test_promtool_finds_only_what_the_servers_names_cause(driven, profile, allowed):
    findings = promtool_check_metrics(driven.tel.render(profile=profile).decode())
    assert set(findings) <= allowed, set(findings) - allowed
    assert findings, "promtool found nothing: the allowed list is stale"


def test_both_profiles_ignore_an_openmetrics_accept(driven):
    """TGI and Triton only speak text format 0.0.4, so their counters keep their names."""
    for profile in ("tgi", "triton"):
        text = driven.tel.render(openmetrics=True, profile=profile).decode()
        assert "# EOF" not in text and parse(text)
