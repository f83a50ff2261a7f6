"""The gateway-api-inference-extension endpoint picker (EPP) reads our `vllm`, `sglang`, `triton` and
`tgi` expositions as it reads those servers.

Mirrors kubernetes-sigs/gateway-api-inference-extension at `a70292c1~1` (the EPP's last commit
there before it moved to llm-d/llm-d-router):
- `pkg/epp/framework/plugins/datalayer/source/metrics/datasource.go` `parseMetrics`: expfmt's text
  parser (text format 0.0.4), families keyed by their TYPE name; a second TYPE line for one name fails.
- `.../extractor/metrics/factories.go` `defaultEngineConfigs["triton-tensorrt-llm"]`: the five specs.
- `.../extractor/metrics/spec.go`: `parseStringToSpec` (quote bare label values with the regex of
  `addQuotesToLabelValues`, parse a PromQL vector selector, keep `=` matchers not starting `__`);
  `getLatestMetric` (among the family's metrics whose labels include the spec's, the largest
  timestamp; a text exposition has none, so the first match wins); `extractValue` (gauge, else
  counter, else 0).
- `.../extractor/metrics/extractor.go` `Extract`: queue, running, block size and block count as
  Go `int(...)`, KV usage as float; a spec that finds nothing adds an error, the others still apply.
TGI is no EPP engine type. It is read as the deprecated per-metric flags read a server
(`--total-queued-requests-metric=tgi_queue_size --total-running-requests-metric=tgi_batch_current_size
--kv-cache-usage-percentage-metric=`: TGI has no KV-usage gauge), through `pkg/epp/backend/metrics`
(`metrics_spec.go` `stringToMetricSpec`, `metrics.go` `promToPodMetrics`: gauge values only). Since
fec7fd01 `Options.Validate` rejects those flags once set; the same names then go in an
`engineConfigs` entry, read by the extractor above (also checked here).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import pytest

from otel_llm import SchedulerSnapshot, StepRecorder, Telemetry, TelemetryConfig
from otel_llm.export.exposition import Renderer
from otel_llm.shim.profiles import get_profile

VLLM = {  # factories.go defaultEngineConfigs, Name "vllm" (block size and count: labels of the info gauge)
    "queue": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "lora": "vllm:lora_requests_info",
}
VLLM_CACHE_INFO = ("vllm:cache_config_info", "block_size", "num_gpu_blocks")  # CacheInfoSpec, label names
SGLANG = {"queue": "sglang:num_queue_reqs", "running": "sglang:num_running_reqs", "kv_usage": "sglang:token_usage"}
TRITON_TRT_LLM = {  # factories.go defaultEngineConfigs, Name "triton-tensorrt-llm"
    "queue": "nv_trt_llm_request_metrics{request_type=waiting}",
    "running": "nv_trt_llm_request_metrics{request_type=scheduled}",
    "kv_usage": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
    "block_size": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
    "num_blocks": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
}
TGI = {"queue": "tgi_queue_size", "running": "tgi_batch_current_size", "kv_usage": ""}  # the deprecated flags


class Metric(NamedTuple):
    labels: dict[str, str]
    value: float
    timestamp_ms: int  # dto.Metric.TimestampMs: 0 when the exposition has none


class MetricFamily(NamedTuple):
    type: str
    metrics: list[Metric]


_LINE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)(?: (-?\d+))?$')
_PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def text_to_metric_families(text: str) -> dict[str, MetricFamily]:
    """expfmt.TextParser, for what these expositions hold (gauges, counters, histograms)."""
    fams: dict[str, MetricFamily] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            if name in fams:
                raise ValueError(f"second TYPE line for metric name {name!r}")
            fams[name] = MetricFamily(kind, [])
        elif line and not line.startswith("#"):
            m = _LINE.match(line)
            if m is None:
                raise ValueError(f"bad sample line {line!r}")
            name = m.group(1)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in fams and fams.get(base, MetricFamily("", [])).type == "histogram":
                continue  # histogram parts: not read by the EPP
            fams.setdefault(name, MetricFamily("untyped", []))
            fams[name].metrics.append(Metric(dict(_PAIR.findall(m.group(2) or "")), float(m.group(3)),
                                             int(m.group(4) or 0)))
    return fams


class Spec(NamedTuple):
    name: str
    labels: dict[str, str]


_BARE = re.compile(r'(\w+)\s*=\s*([^",}\s]+)')  # spec.go addQuotesToLabelValues
_SELECTOR = re.compile(r'^\s*([a-zA-Z_:][\w:]*)\s*(?:\{(.*)\})?\s*$')
_MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def parse_string_to_spec(spec: str) -> Spec | None:
    """spec.go parseStringToSpec: "" is no spec; PromQL `name{l=v,...}`, bare values quoted."""
    if spec == "":
        return None
    m = _SELECTOR.match(_BARE.sub(r'\1="\2"', spec))
    if m is None:
        raise ValueError(f"not a valid metric specification: {spec!r}")
    labels = {k: v for k, op, v in _MATCHER.findall(m.group(2) or "") if op == "=" and not k.startswith("__")}
    return Spec(m.group(1), labels)


def string_to_metric_spec(spec: str) -> Spec | None:
    """metrics_spec.go stringToMetricSpec (the deprecated flags): split on `{`, `,`, `=`."""
    spec = spec.strip()
    if spec == "":
        return None
    if "{" not in spec:
        return Spec(spec, {})
    name, _, rest = spec.partition("{")
    pairs = [p.strip().split("=") for p in rest.rstrip("}").split(",")]
    return Spec(name.strip(), {k.strip(): v.strip() for k, v in pairs})


def get_latest_metric(spec: Spec, fams: dict[str, MetricFamily]) -> tuple[Metric, str]:
    """spec.go getLatestMetric: the matching metric with the largest timestamp, first on ties."""
    fam = fams.get(spec.name)
    if fam is None or not fam.metrics:
        raise LookupError(f"metric family {spec.name!r} not found")
    latest, recent = None, -1
    for metric in fam.metrics:
        if spec.labels.items() <= metric.labels.items() and metric.timestamp_ms > recent:
            latest, recent = metric, metric.timestamp_ms
    if latest is None:
        raise LookupError(f"no matching metric found for {spec.name!r} with labels {spec.labels}")
    return latest, fam.type


def extract_value(metric: Metric, kind: str) -> float:
    """spec.go extractValue: a gauge's or a counter's value, else 0."""
    return metric.value if kind in ("gauge", "counter") else 0.0


def extract(specs: dict[str, str], text: str) -> tuple[dict[str, float], list[str]]:
    """extractor.go Extract: the endpoint's metrics (ints as Go truncates them) and the errors."""
    fams = text_to_metric_families(text)
    out, errs = {}, []
    for key, spec_text in specs.items():
        spec = parse_string_to_spec(spec_text)
        if spec is None:
            continue
        try:
            v = extract_value(*get_latest_metric(spec, fams))
        except LookupError as e:
            errs.append(str(e))
            continue
        out[key] = v if key == "kv_usage" else int(v)
    return out, errs


def extract_deprecated_flags(specs: dict[str, str], text: str) -> dict[str, float]:
    """metrics.go promToPodMetrics: `int(metric.GetGauge().GetValue())` (0 unless a gauge)."""
    fams = text_to_metric_families(text)
    out = {}
    for key, spec_text in specs.items():
        spec = string_to_metric_spec(spec_text)
        if spec is not None:
            metric, kind = get_latest_metric(spec, fams)
            v = metric.value if kind == "gauge" else 0.0
            out[key] = v if key == "kv_usage" else int(v)
    return out


def _telemetry(model: str = "m", cache=None) -> Telemetry:
    cache = {"block_size": 16, "num_gpu_blocks": 1000} if cache is None else cache
    return Telemetry(TelemetryConfig(model, log_stats=False, tracing=False, cache_config=cache))


def _load(tel: Telemetry, running: int, waiting: int, kv: float) -> None:
    rec = StepRecorder()
    rec.snapshot(SchedulerSnapshot(running=running, waiting=waiting, kv_usage=kv))
    tel.ingest(rec.end_step_bytes())


def test_spec_parsing_is_the_epps():
    assert parse_string_to_spec(TRITON_TRT_LLM["queue"]) == Spec("nv_trt_llm_request_metrics",
                                                                  {"request_type": "waiting"})
    assert parse_string_to_spec('x{a="b", c=d, e!="f", __name__="x"}') == Spec("x", {"a": "b", "c": "d"})
    assert parse_string_to_spec("tgi_queue_size") == Spec("tgi_queue_size", {})
    assert parse_string_to_spec("") is None
    assert string_to_metric_spec(" nv_trt_llm_request_metrics{request_type=waiting} ") == \
        parse_string_to_spec(TRITON_TRT_LLM["queue"])


def test_triton_tensorrt_llm_engine_reads_every_metric():
    tel = _telemetry()
    _load(tel, running=3, waiting=2, kv=0.4375)
    got, errs = extract(TRITON_TRT_LLM, tel.render(profile="triton").decode())
    assert errs == []
    assert got == {"queue": 2, "running": 3, "kv_usage": 0.4375, "block_size": 16, "num_blocks": 1000}


def test_triton_without_a_block_count_reads_the_rest_and_reports_one_error():
    tel = _telemetry(cache={"block_size": 16, "num_gpu_blocks": ""})
    _load(tel, running=1, waiting=0, kv=0.1)
    got, errs = extract(TRITON_TRT_LLM, tel.render(profile="triton").decode())
    assert got == {"queue": 0, "running": 1, "kv_usage": 0.1, "block_size": 16}
    assert errs == ["no matching metric found for 'nv_trt_llm_kv_cache_block_metrics' with labels "
                    "{'kv_cache_block_type': 'max'}"]


def test_two_models_on_one_endpoint_the_epp_takes_the_first_series():
    """No timestamps in the text: getLatestMetric keeps the first match (model `a` here); the
    triton spec has no model label (cf. GIE #2950 for data-parallel vLLM)."""
    a, b = _telemetry("a"), _telemetry("b")
    _load(a, running=5, waiting=7, kv=0.5)
    _load(b, running=1, waiting=1, kv=0.25)
    text = Renderer(get_profile("triton")).render([a.source(), b.source()]).decode()
    got, errs = extract(TRITON_TRT_LLM, text)
    assert errs == [] and (got["queue"], got["running"], got["kv_usage"]) == (7, 5, 0.5)
    fams = text_to_metric_families(text)
    assert [m.labels["model"] for m in fams["nv_trt_llm_request_metrics"].metrics] == ["a", "b", "a", "b"]


def test_tgi_through_the_deprecated_flags_and_an_engine_config():
    tel = _telemetry()
    _load(tel, running=4, waiting=9, kv=0.9)
    text = tel.render(profile="tgi").decode()
    assert extract_deprecated_flags(TGI, text) == {"queue": 9, "running": 4}
    assert extract(TGI, text) == ({"queue": 9, "running": 4}, [])  # engineConfigs entry "tgi"
    assert "kv_cache" not in text  # the KV-utilization scorer gets nothing from TGI's names


def test_the_epp_parser_rejects_a_duplicate_family():
    """Families sharing a name are written under one HELP/TYPE, or expfmt would refuse the scrape."""
    text = _telemetry().render(profile="triton").decode()
    assert text.count("# TYPE nv_trt_llm_kv_cache_block_metrics ") == 1
    with pytest.raises(ValueError, match="second TYPE line"):
        text_to_metric_families(text + "# TYPE nv_trt_llm_request_metrics gauge\n")


def extract_cache_info(spec: tuple[str, str, str], text: str) -> dict[str, int]:
    """extractor.go, CacheInfoSpec: block size and block count are label values of the latest
    series of an info-style gauge (`CacheBlockSizeLabelName`, `CacheNumBlocksLabelName`)."""
    metric, _ = get_latest_metric(parse_string_to_spec(spec[0]), text_to_metric_families(text))
    return {"block_size": int(metric.labels[spec[1]]), "num_blocks": int(metric.labels[spec[2]])}


def test_vllm_engine_reads_every_metric_but_lora():
    tel = _telemetry()
    _load(tel, running=6, waiting=3, kv=0.125)
    text = tel.render(profile="vllm").decode()
    got, errs = extract(VLLM, text)
    assert got == {"queue": 3, "running": 6, "kv_usage": 0.125}
    assert errs == ["metric family 'vllm:lora_requests_info' not found"]  # as vLLM without --enable-lora
    assert extract_cache_info(VLLM_CACHE_INFO, text) == {"block_size": 16, "num_blocks": 1000}


def test_sglang_engine_reads_every_metric():
    tel = _telemetry()
    _load(tel, running=2, waiting=5, kv=0.75)
    got, errs = extract(SGLANG, tel.render(profile="sglang").decode())
    assert errs == [] and got == {"queue": 5, "running": 2, "kv_usage": 0.75}
