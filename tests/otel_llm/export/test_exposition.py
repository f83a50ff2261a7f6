"""The shim's exposition: vLLM's exact families, parseable text/OpenMetrics, promtool, exemplars."""

import numpy as np
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from otel_llm import FinishReason, RequestInfo
from otel_llm.canonical import instruments as I
from otel_llm.canonical.instruments import Kind
from otel_llm.canonical.metrics_state import HistogramSnapshot
from otel_llm.export.exposition import SelfFamily, _exemplars, negotiate, self_family_lines
from otel_llm.export.prom_families import go_float
from tests.harness.prometheus import promtool_check_metrics

S, MS = 1_000_000_000, 1_000_000
TOKENS = I._build_1_2_5(8192)
# vllm/v1/metrics/loggers.py PrometheusStatLogger core families: name -> (type, extra labels, buckets)
VLLM_CORE = {
    "vllm:num_requests_running": ("gauge", (), None),
    "vllm:num_requests_waiting": ("gauge", (), None),
    "vllm:kv_cache_usage_perc": ("gauge", (), None),
    "vllm:prefix_cache_queries": ("counter", (), None),
    "vllm:prefix_cache_hits": ("counter", (), None),
    "vllm:num_preemptions": ("counter", (), None),
    "vllm:prompt_tokens": ("counter", (), None),
    "vllm:generation_tokens": ("counter", (), None),
    "vllm:request_success": ("counter", ("finished_reason",), None),
    "vllm:request_prompt_tokens": ("histogram", (), TOKENS),
    "vllm:request_generation_tokens": ("histogram", (), TOKENS),
    "vllm:iteration_tokens_total": ("histogram", (), I.VLLM_ITERATION_TOKENS),
    "vllm:request_max_num_generation_tokens": ("histogram", (), TOKENS),
    "vllm:request_params_n": ("histogram", (), I.VLLM_PARAMS_N),
    "vllm:request_params_max_tokens": ("histogram", (), TOKENS),
    "vllm:time_to_first_token_seconds": ("histogram", (), I.VLLM_TTFT),
    "vllm:inter_token_latency_seconds": ("histogram", (), I.VLLM_ITL),
    "vllm:request_time_per_output_token_seconds": ("histogram", (), I.VLLM_ITL),
    "vllm:e2e_request_latency_seconds": ("histogram", (), I.VLLM_REQUEST_LATENCY),
    "vllm:request_queue_time_seconds": ("histogram", (), I.VLLM_REQUEST_LATENCY),
    "vllm:request_inference_time_seconds": ("histogram", (), I.VLLM_REQUEST_LATENCY),
    "vllm:request_prefill_time_seconds": ("histogram", (), I.VLLM_REQUEST_LATENCY),
    "vllm:request_decode_time_seconds": ("histogram", (), I.VLLM_REQUEST_LATENCY),
    "vllm:request_num_preemptions": ("histogram", (), I.VLLM_NUM_PREEMPTIONS),
}


def workload(h, n=5):
    rids = []
    for i in range(n):
        h.fclock.t = S
        rid = h.tel.arrival(RequestInfo(f"r{i}", 10 + i, "chat", max_tokens=8))
        h.at(S).queued(rid)
        h.at(S + MS).scheduled(rid, 4)
        rids.append(rid)
    for k in range(3):
        h.at(S + (10 + k) * MS).outputs(rids, 1)
        if k == 2:
            for rid in rids:
                h.rec.finished(rid, FinishReason.STOP)
        h.step(S + (10 + k) * MS, S + (20 + k) * MS, prompt_tokens=50 if k == 0 else 0)
    return rids


@pytest.fixture
def vllm_text(h):
    workload(h)
    return h.tel.render().decode()


def test_vllm_profile_has_every_core_family_exactly(vllm_text):
    families = {f.name: f for f in parse_text(vllm_text)}
    for name, (kind, extra, buckets) in VLLM_CORE.items():
        fam = families.get(name)
        assert fam is not None, f"missing {name}"
        assert fam.type == kind, name
        for sample in fam.samples:
            labels = set(sample.labels) - {"le"}
            assert labels == {"model_name", "engine", *extra}, (name, labels)
        if buckets is not None:
            les = [s.labels["le"] for s in fam.samples if s.name == name + "_bucket"]
            assert [float(x) for x in les[:-1]] == list(buckets) and les[-1] == "+Inf", name
    assert "vllm:cache_config_info" not in families  # only with a cache config
    assert any(s.name == "vllm:prompt_tokens_total" and s.value == 60 for s in families["vllm:prompt_tokens"].samples)


def test_cache_config_info_and_values(h):
    from tests.otel_llm.conftest import Harness
    hh = Harness(cache_config={"block_size": 16, "enable_prefix_caching": True})
    workload(hh)
    fams = {f.name: f for f in parse_text(hh.tel.render().decode())}
    (sample,) = fams["vllm:cache_config_info"].samples
    assert sample.value == 1 and sample.labels == {"block_size": "16", "enable_prefix_caching": "True", "engine": "0"}
    success = {s.labels["finished_reason"]: s.value for s in fams["vllm:request_success"].samples}
    assert success == {"stop": 5, "length": 0, "abort": 0, "error": 0, "repetition": 0}  # vLLM 0.32 pre-creates all five
    ttft = {s.labels["le"]: s.value for s in fams["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")}
    assert ttft["0.01"] == 0 and ttft["0.02"] == 5  # 19 ms each


def test_otel_profile_uses_semconv_names_and_buckets(h):
    workload(h)
    text = h.tel.render(profile="otel").decode()
    fams = {f.name: f for f in parse_text(text)}
    ttft = fams["gen_ai_server_time_to_first_token_seconds"]
    les = [s.labels["le"] for s in ttft.samples if s.name.endswith("_bucket")]
    assert [float(x) for x in les[:-1]] == list(I.SEMCONV_TTFT)
    assert {"gen_ai_request_model", "gen_ai_operation_name"} <= set(ttft.samples[0].labels)
    assert "gen_ai_server_request_duration_seconds" in fams
    assert "gen_ai_server_time_per_output_token_seconds" in fams
    assert fams["otel_llm_usage_generation_tokens"].type == "counter"


def test_promtool_otel_clean_and_vllm_only_vllm_naming_findings(h):
    workload(h)
    assert promtool_check_metrics(h.tel.render(profile="otel").decode()) == []
    findings = promtool_check_metrics(h.tel.render().decode())
    # vLLM's own names: ':' (reserved for recording rules) and a histogram named *_total.
    unexplained = [f for f in findings if "should not contain ':'" not in f
                   and f != 'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix']
    assert unexplained == [], unexplained


def test_openmetrics_parses_and_carries_exemplars(h):
    rids = workload(h)
    body = h.tel.render(openmetrics=True).decode()
    assert body.endswith("# EOF\n")
    fams = {f.name: f for f in parse_openmetrics(body)}
    trace_ids = {format(span.context.trace_id, "032x") for span in h.exporter.get_finished_spans()}
    e2e = fams["vllm:e2e_request_latency_seconds"]
    exemplars = [s.exemplar for s in e2e.samples if s.exemplar is not None]
    assert exemplars and all(e.labels["trace_id"] in trace_ids for e in exemplars)
    assert len(rids) == 5


def _exemplars_reference(h, series, ends, scale):
    """The obvious way: per coarse bucket, each series in order, its latest fine bucket; a later series
    replaces the best only when strictly more recent."""
    trace, value, when = h.exemplars
    nb = h.counts.shape[1]
    out, lo = [], 0
    for hi in ends.tolist():
        best, best_t = None, 0
        for s in series.tolist():
            idx = s * nb + np.arange(lo, hi + 1)
            k = int(np.argmax(when[idx]))
            if when[idx[k]] > best_t:
                best, best_t = idx[k], int(when[idx[k]])
        if best is None:
            out.append("")
        else:
            hi_, lo_, span = (int(x) for x in trace[best][:3])
            out.append(f' # {{trace_id="{(hi_ << 64 | lo_):032x}",span_id="{span:016x}"}} '
                       f"{go_float(value[best] * scale)} {best_t / 1e9:.3f}")
        lo = hi + 1
    return out


@pytest.mark.parametrize("seed", range(20))
def test_exemplar_choice_matches_the_reference_ties_included(seed):
    """The vectorised choice of each coarse bucket's exemplar equals the per-series loop, with many
    exemplars sharing one time (one flush stamps them all with the same time)."""
    rng = np.random.default_rng(seed)
    n_series, nb = int(rng.integers(1, 9)), int(rng.integers(2, 30))
    when = rng.choice([0, 0, 0, 5 * S, 7 * S], size=n_series * nb).astype(np.int64)
    trace = rng.integers(1, 2**63, size=(n_series * nb, 4)).astype(np.uint64)
    value = rng.random(n_series * nb)
    h = HistogramSnapshot(np.arange(nb - 1, dtype=float), np.zeros((n_series, nb), np.int64), np.zeros(n_series),
                          np.zeros(n_series), np.zeros(n_series), (trace, value, when))
    ends = np.append(np.sort(rng.choice(nb - 1, size=int(rng.integers(0, nb)), replace=False)), nb - 1)
    series = np.sort(rng.choice(n_series, size=int(rng.integers(1, n_series + 1)), replace=False))
    assert _exemplars(h, series, ends, 1e-9) == _exemplars_reference(h, series, ends, 1e-9)


def test_content_negotiation():
    assert negotiate("application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5")
    assert not negotiate("text/plain") and not negotiate(None)


def test_help_text_is_escaped_as_each_format_requires():
    """0.0.4 escapes backslash and newline in HELP, OpenMetrics also the double quote; both parse back."""
    help_text = 'Say "hi" to C:\\dir\nnext line'
    family = SelfFamily("otel_llm_things", Kind.GAUGE, help_text, (("", 1.0),))
    for openmetrics, parse in ((False, parse_text), (True, parse_openmetrics)):
        lines: list[str] = []
        self_family_lines(lines, [family], openmetrics)
        quote = '\\"' if openmetrics else '"'
        assert lines[0] == f"# HELP otel_llm_things Say {quote}hi{quote} to C:\\\\dir\\nnext line"
        text = "\n".join(lines) + ("\n# EOF\n" if openmetrics else "\n")
        assert [f.documentation for f in parse(text)] == [help_text]
        if not openmetrics:
            assert promtool_check_metrics(text) == []
