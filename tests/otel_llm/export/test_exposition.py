"""The shim's exposition: vLLM's exact families, parseable text/OpenMetrics, promtool, exemplars."""

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from otel_llm import FinishReason, RequestInfo
from otel_llm.canonical import instruments as I
from otel_llm.canonical.instruments import Kind
from otel_llm.export.exposition import SelfFamily, negotiate, self_family_lines
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
