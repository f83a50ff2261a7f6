"""The generated otelcol-contrib config: documented keys only, complete pipelines, and renames that
reproduce the server's own /metrics labels for every family of both profiles."""

import random
import re

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.canonical.instruments import (
    CACHE_CONFIG_INFO, CACHE_CONFIG_PREFIX, DIMENSIONS, ENGINE_ATTRIBUTE, MODEL_ATTRIBUTE, PROVIDER_ATTRIBUTE, Kind,
    instrument_table,
)
from otel_llm.cli.tls import TlsConfig
from otel_llm.collector.extension.auth import parse_auth
from otel_llm.collector.otelcol.config import extra_le_bounds, otelcol_config, render_otelcol_config, target_name
from otel_llm.collector.processor.metric_routes import collector_profile
from otel_llm.collector.processor.tail_sampling import TailSampler, TailSamplingConfig
from otel_llm.export.exposition import series_groups
from otel_llm.pipeline import PipelineConfig, PipelineTelemetry, TransferHop
from otel_llm.shim.prometheus_naming import label_name
from otel_llm.shim.profiles import get_profile

PROFILES = ("vllm", "otel")
CORE, CONTRIB = "open-telemetry/opentelemetry-collector", "open-telemetry/opentelemetry-collector-contrib"

# Component type -> (every key path the generator may use, where it is documented). Paths are dotted;
# `[]` marks the items of a list. Read in the stored copies: core @v0.159.0 (934999fb), contrib from
# its file index (latest stored versions of each file).
DOCUMENTED = {
    ("receivers", "otlp"): (
        {f"protocols.{p}.{k}" for p in ("grpc", "http")
         for k in ("endpoint", "tls.cert_file", "tls.key_file", "tls.client_ca_file", "auth.authenticator")},
        f"{CORE}: receiver/otlpreceiver/config.go (protocols.grpc, protocols.http), "
        "config/confignet/confignet.go (endpoint), config/configtls/configtls.go (ServerConfig: cert_file, "
        "key_file, client_ca_file), config/configauth/configauth.go (authenticator)"),
    ("extensions", "bearertokenauth"): (
        {"filename"}, f"{CONTRIB}: extension/bearertokenauthextension/README.md, config.go"),
    ("extensions", "basicauth"): (
        {"htpasswd.file"}, f"{CONTRIB}: extension/basicauthextension/README.md, config.go"),
    ("processors", "memory_limiter"): (
        {"check_interval", "limit_mib", "spike_limit_mib"},
        f"{CORE}: internal/memorylimiter/config.go, processor/memorylimiterprocessor/README.md"),
    ("processors", "batch"): (set(), f"{CORE}: processor/batchprocessor/config.go (all defaults)"),
    ("processors", "filter"): (
        {"error_mode", "metrics.metric"},
        f"{CONTRIB}: processor/filterprocessor/config.go (MetricFilters.MetricConditions `metric`), README.md"),
    ("processors", "transform"): (
        {"error_mode", "metric_statements[].context", "metric_statements[].statements"},
        f"{CONTRIB}: processor/transformprocessor/README.md, internal/common/config.go (ContextStatements)"),
    ("processors", "metricstransform"): (
        {"transforms[].include", "transforms[].match_type", "transforms[].action", "transforms[].new_name",
         "transforms[].operations[].action", "transforms[].operations[].label", "transforms[].operations[].new_label",
         "transforms[].operations[].label_set", "transforms[].operations[].aggregation_type",
         "transforms[].operations[].value_actions[].value", "transforms[].operations[].value_actions[].new_value"},
        f"{CONTRIB}: processor/metricstransformprocessor/config.go, README.md, operation_aggregate_labels.go "
        "(histograms summed bucket-wise)"),
    ("exporters", "prometheus"): (
        {"endpoint", "enable_open_metrics", "metric_expiration", "translation_strategy", "without_scope_info",
         "tls.cert_file", "tls.key_file", "tls.client_ca_file"},
        f"{CONTRIB}: exporter/prometheusexporter/config.go, README.md"),
    ("exporters", "prometheusremotewrite"): (
        {"endpoint", "translation_strategy", "disable_scope_info"},
        f"{CONTRIB}: exporter/prometheusremotewriteexporter/config.go (flat client `endpoint`: deprecated "
        "v0.158.0 in favour of http.endpoint, still accepted), README.md"),
    ("exporters", "otlp"): (
        {"endpoint", "tls.insecure", "sending_queue.storage"},
        f"{CORE}: exporter/otlpexporter/config.go, config/configgrpc/configgrpc.go (endpoint, tls), "
        "config/configtls/generated_config.go (insecure), exporter/exporterhelper/internal/queuebatch/config.go "
        "(`storage`; the queue is on by default: factory.go configoptional.Some), exporterhelper/README.md "
        "(Persistent Queue); deprecated type alias of otlp_grpc since v0.144.0"),
    ("exporters", "otlphttp"): (
        {"traces_endpoint", "metrics_endpoint", "sending_queue.storage"},
        f"{CORE}: exporter/otlphttpexporter/config.go (TracesEndpoint, MetricsEndpoint, used as is; Validate: one endpoint "
        "suffices), README.md, exporter/exporterhelper/internal/queuebatch/config.go (`storage`); deprecated "
        "type alias of otlp_http since v0.144.0"),
    ("extensions", "file_storage"): (
        {"directory"},
        f"{CONTRIB}: extension/storage/filestorage/config.go, README.md (the directory must exist)"),
    ("processors", "tail_sampling"): (
        {"decision_wait", "decision_wait_after_root_received", "num_traces", "decision_cache.sampled_cache_size",
         "decision_cache.non_sampled_cache_size", "policies[].name", "policies[].type",
         "policies[].status_code.status_codes", "policies[].ottl_condition.error_mode",
         "policies[].ottl_condition.span", "policies[].ottl_condition.spanevent",
         "policies[].probabilistic.sampling_percentage"},
        f"{CONTRIB}: processor/tailsamplingprocessor/config.go, config.schema.yaml (numeric_attribute: int64 "
        "only), README.md, internal/sampling/ottl.go (span / spanevent conditions, ORed), "
        "internal/sampling/probabilistic.go (FNV-1a of salt + trace id); decision_wait_after_root_received: "
        "CHANGELOG.md v0.144.0 (#43876)"),
}
ENUMS = {  # documented values of the enumerated keys used
    "translation_strategy": {"UnderscoreEscapingWithSuffixes", "UnderscoreEscapingWithoutSuffixes",
                             "NoUTF8EscapingWithSuffixes", "NoTranslation"},
    "match_type": {"strict", "regexp"},
    "aggregation_type": {"sum", "mean", "min", "max"},
    "error_mode": {"ignore", "silent", "propagate"},
    "context": {"resource", "scope", "metric", "datapoint"},
    "type": {"always_sample", "latency", "numeric_attribute", "probabilistic", "status_code", "string_attribute",
             "rate_limiting", "span_count", "trace_state", "boolean_attribute", "ottl_condition", "and", "drop",
             "composite"},  # tail_sampling policy types, README.md
    "status_codes": {"OK", "ERROR", "UNSET"},
}
OTTL_FUNCTIONS = {"delete_key", "replace_all_patterns"}  # contrib pkg/ottl/ottlfuncs/README.md
SERVICE_KEYS = {"extensions", "pipelines"}  # core service/config.go; pipeline keys: service/pipelines/config.go
PIPELINE_KEYS = {"receivers", "processors", "exporters"}


def _paths(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
        for item in node:
            yield from _paths(item, prefix + "[]")
    else:
        yield prefix


def _components(config):
    for kind in ("receivers", "processors", "exporters", "extensions"):
        for cid, body in config.get(kind, {}).items():
            yield kind, cid, cid.split("/")[0], body


# --- a tiny interpreter for exactly the operations the generator emits ------------------------------

_STR = r'"((?:[^"\\]|\\.)*)"'
_DELETE = re.compile(rf"^delete_key\(attributes, {_STR}\) where (.+)$")
_REPLACE_KEYS = re.compile(rf'^replace_all_patterns\(attributes, "key", {_STR}, {_STR}\) where (.+)$')
_CLAUSE = re.compile(rf"^(metric\.name|name|attributes\[{_STR}\]) == {_STR}$")


def _unquote(s):
    return re.sub(r"\\(.)", r"\1", s)


def _holds(condition, name, attrs):
    for clause in condition.split(" and "):
        m = _CLAUSE.match(clause)
        assert m, f"unsupported OTTL condition {clause!r}"
        actual = name if m.group(2) is None else attrs.get(_unquote(m.group(2)))
        if actual != _unquote(m.group(3)):
            return False
    return True


def _statement(st, name, attrs):
    assert st.split("(")[0] in OTTL_FUNCTIONS, st
    if m := _DELETE.match(st):
        if _holds(m.group(2), name, attrs):
            attrs.pop(_unquote(m.group(1)), None)
    elif m := _REPLACE_KEYS.match(st):
        if _holds(m.group(3), name, attrs):
            pattern, repl = re.compile(_unquote(m.group(1))), _unquote(m.group(2))
            attrs = {pattern.sub(repl, k): v for k, v in attrs.items()}
    else:
        raise AssertionError(f"unsupported OTTL statement {st!r}")
    return attrs


def _operation(op, attrs):
    if op["action"] == "aggregate_labels":  # keeps label_set; same-label points are summed
        return {k: v for k, v in attrs.items() if k in op["label_set"]}
    assert op["action"] == "update_label", op
    if op["label"] not in attrs:
        return attrs
    value = attrs.pop(op["label"])
    value = {a["value"]: a["new_value"] for a in op.get("value_actions", [])}.get(value, value)
    attrs[op.get("new_label", op["label"])] = value
    return attrs


def simulate(config, name, attrs):
    """(exposed name, label pairs) of one data point through the metrics pipeline; None when dropped."""
    attrs = dict(attrs)
    for pid in config["service"]["pipelines"]["metrics"]["processors"]:
        ptype, body = pid.split("/")[0], config["processors"][pid]
        if ptype == "filter" and any(_holds(c, name, attrs) for c in body["metrics"]["metric"]):
            return None
        if ptype == "transform":
            for group in body["metric_statements"]:
                assert group["context"] == "datapoint"
                for st in group["statements"]:
                    attrs = _statement(st, name, attrs)
        if ptype == "metricstransform":
            for t in body["transforms"]:
                if t["match_type"] == "strict" and t["include"] == name:
                    for op in t["operations"]:
                        attrs = _operation(op, attrs)
                    name = t["new_name"]
    return name, frozenset(attrs.items())


CACHE_CONFIG = {"block_size": "16", "gpu_memory_utilization": "0.9"}


def _points(inst):
    """Attributes of every series of `inst` as the server sends them (otel_llm/export/metric_producer.py)."""
    vocab = [DIMENSIONS[d] for d in inst.dims]
    for series in range(inst.num_series):
        attrs = {MODEL_ATTRIBUTE: "m", ENGINE_ATTRIBUTE: "0", PROVIDER_ATTRIBUTE: "otel_llm"}
        if inst.name == CACHE_CONFIG_INFO:
            attrs.update((CACHE_CONFIG_PREFIX + k, v) for k, v in CACHE_CONFIG.items())
        rest = series
        for d, values in reversed(list(zip(inst.dims, vocab))):
            attrs[d] = values[rest % len(values)]
            rest //= len(values)
        yield attrs


@pytest.mark.parametrize("profile_name", PROFILES)
def test_every_family_exposes_exactly_the_servers_series(profile_name):
    config, profile = otelcol_config(profile_name), collector_profile(profile_name)
    families = {f.canonical: f for f in profile.families}
    for inst in instrument_table(8192).values():
        got = {simulate(config, inst.name, a) for a in _points(inst)}
        fam = families.get(inst.name)
        if fam is None:
            assert got == {None}, inst.name
            continue
        base = ((profile.model_label, "m"), (profile.engine_label, "0"))
        if fam.base is not None:  # the family's own base labels (vllm:admission_rejections: no engine)
            base = tuple((label, {"model": "m", "engine": "0"}[f]) for label, f in fam.base)
        if inst.name == CACHE_CONFIG_INFO:
            base = tuple(CACHE_CONFIG.items()) + ((profile.engine_label, "0"),)
        want = {(target_name(fam), frozenset(base + pairs)) for pairs, _ in series_groups(inst, fam)}
        assert got == want, inst.name


@pytest.mark.parametrize("profile_name", PROFILES)
def test_renames_are_the_profiles(profile_name):
    config, profile = otelcol_config(profile_name), collector_profile(profile_name)
    table = instrument_table(8192)
    transforms = config["processors"][f"metricstransform/{profile_name}"]["transforms"][:len(profile.families)]
    assert [t["include"] for t in transforms] == [f.canonical for f in profile.families]
    for t, fam in zip(transforms, profile.families):
        suffix = "_total" if table[fam.canonical].kind is Kind.COUNTER else ""
        assert t["new_name"] == fam.name + suffix
        renames = {op["label"]: op["new_label"] for op in t["operations"] if "new_label" in op}
        want = {ENGINE_ATTRIBUTE: profile.engine_label, **{d: label for d, (label, _) in fam.labels.items()}}
        if fam.canonical != CACHE_CONFIG_INFO:
            want[MODEL_ATTRIBUTE] = profile.model_label
        if fam.base is not None:
            want.pop(ENGINE_ATTRIBUTE)
            want.update({{"model": MODEL_ATTRIBUTE, "engine": ENGINE_ATTRIBUTE}[f]: label for label, f in fam.base})
        assert renames == want


@pytest.mark.parametrize("profile_name", PROFILES)
def test_every_pipeline_family_is_served_as_the_pipeline_serves_it(profile_name):
    """Each pipeline instrument's points (the SDK's OTLP: otel_llm.pipeline.otlp) come out with the name and
    labels of the pipeline's own /metrics under that profile, its overflow series included."""
    pipeline = PipelineTelemetry(PipelineConfig("m", cardinality_limit=1))
    r = pipeline.arrival("r", audio=True)
    for replica in "01":
        r.stage_started("1", replica, queued_ns=pipeline.clock())
        r.stage_finished("1", replica)
        r.audio_chunk("1", replica, 4800)
        r.transfer(TransferHop("0", "0", "1", replica, 10, 0, 1, 2, 3))
    r.finish("stop", prompt_tokens=1, generation_tokens=1)
    pipeline.arrival("s").fail("stage_error")
    empty = pipeline.arrival("t", audio=True)  # no audio: skipped
    empty.stage_started("1", "0")
    empty.finish()
    pipeline.stage_waiting("0", "0", 1)
    pipeline.stream_completed()
    pipeline.stream_aborted("closed")
    config = otelcol_config(profile_name)
    got, want = set(), set()
    for metric in pipeline.to_metrics():
        for point in metric.data.data_points:
            attrs = {k: str(v).lower() if isinstance(v, bool) else v for k, v in point.attributes.items()}
            name, pairs = simulate(config, metric.name, attrs)
            got.add((name, frozenset((label_name(k), v) for k, v in pairs)))  # the exporter's own escaping
    for fam in text_string_to_metric_families(pipeline.render(profile=profile_name).decode()):
        for sample in fam.samples:
            if not sample.name.endswith(("_bucket", "_sum")):
                name = sample.name.removesuffix("_count") if fam.type == "histogram" else sample.name
                want.add((name, frozenset(sample.labels.items())))
    assert got == want and len({n for n, _ in want}) == 24


TRACES = {"traces_to": ("grpc://jaeger:4317", "http://tempo:4318", "https://t.example/otlp/v1/traces"),
          "storage_dir": "/var/lib/otelcol/queues", "tail_sampling": TailSamplingConfig(),
          "metrics_to": ("grpc://mimir:4317", "http://mimir:4318")}


@pytest.mark.parametrize("traces", [{"traces_endpoint": "jaeger:4317"}, TRACES], ids=["endpoint", "all_flags"])
@pytest.mark.parametrize("profile_name", PROFILES)
def test_yaml_parses_and_uses_only_documented_keys(profile_name, traces):
    kwargs = {"remote_write_urls": ["http://a:9090/api/v1/write"], **traces}
    text = render_otelcol_config(profile_name, **kwargs)
    assert "otelcol-contrib --config" in text.split("\nreceivers:")[0]
    config = yaml.safe_load(text)
    assert config == otelcol_config(profile_name, **kwargs)
    check_documented(config)


@pytest.mark.parametrize("auth_kind", ["bearer-token-file", "htpasswd-file"])
def test_tls_and_auth_go_on_every_listener_with_documented_keys(tmp_path, auth_kind):
    secret = tmp_path / "secret"
    secret.write_text("user:password\n" if auth_kind == "htpasswd-file" else "token\n")
    tls = TlsConfig("/etc/otelcol/cert.pem", "/etc/otelcol/key.pem", "/etc/otelcol/ca.pem")
    config = yaml.safe_load(render_otelcol_config("vllm", tls=tls, auth=parse_auth(f"{auth_kind}={secret}"),
                                                  traces_endpoint="jaeger:4317"))
    check_documented(config)
    name = "bearertokenauth/server" if auth_kind == "bearer-token-file" else "basicauth/server"
    expected = {"bearertokenauth/server": {"filename": str(secret)},
                "basicauth/server": {"htpasswd": {"file": str(secret)}}}[name]
    assert config["extensions"][name] == expected and name in config["service"]["extensions"]
    want_tls = {"cert_file": "/etc/otelcol/cert.pem", "key_file": "/etc/otelcol/key.pem",
                "client_ca_file": "/etc/otelcol/ca.pem"}
    for protocol in config["receivers"]["otlp"]["protocols"].values():
        assert protocol["tls"] == want_tls and protocol["auth"] == {"authenticator": name}
    assert config["exporters"]["prometheus"]["tls"] == want_tls


def check_documented(config: dict) -> None:
    assert set(config) <= {"receivers", "processors", "exporters", "extensions", "service"}
    for kind, cid, ctype, body in _components(config):
        keys, source = DOCUMENTED[(kind, ctype)]
        used = {p for p in _paths(body) if p}
        assert used <= keys, f"{cid}: {used - keys} not documented in {source}"
        for path in used:
            leaf = path.rsplit(".", 1)[-1].removesuffix("[]")
            if leaf in ENUMS:
                values = [v for x in _leaf_values(body, path) for v in (x if isinstance(x, list) else [x])]
                assert set(values) <= ENUMS[leaf], (cid, path)
    assert set(config["service"]) <= SERVICE_KEYS
    assert config["service"].get("extensions", []) == list(config.get("extensions", {}))
    for pipeline in config["service"]["pipelines"].values():
        assert set(pipeline) <= PIPELINE_KEYS


def _leaf_values(node, path):
    head, _, rest = path.partition(".")
    key = head.removesuffix("[]")
    if key not in node:
        return
    for item in node[key] if head.endswith("[]") else [node[key]]:
        if rest:
            yield from _leaf_values(item, rest)
        else:
            yield item


def test_both_exporters_keep_names_as_renamed():
    config = otelcol_config("vllm", remote_write_urls=["http://a/api/v1/write"])
    for cid in ("prometheus", "prometheusremotewrite/0"):
        assert config["exporters"][cid]["translation_strategy"] == "UnderscoreEscapingWithoutSuffixes"
    assert config["exporters"]["prometheus"]["enable_open_metrics"] is True
    assert config["exporters"]["prometheus"]["metric_expiration"] == "5m"


@pytest.mark.parametrize("traces", [None, "jaeger:4317"])
@pytest.mark.parametrize("urls", [(), ("http://a:9090/api/v1/write", "https://b/push")])
def test_pipelines_are_complete(urls, traces):
    config = otelcol_config("vllm", remote_write_urls=urls, traces_endpoint=traces)
    _check_complete(config)
    remote = [c for c in config["exporters"] if c.startswith("prometheusremotewrite/")]
    assert sorted(config["exporters"][c]["endpoint"] for c in remote) == sorted(urls)
    assert set(config["service"]["pipelines"]) == ({"metrics", "traces"} if traces else {"metrics"})
    if traces:
        assert config["exporters"]["otlp/traces"] == {"endpoint": traces, "tls": {"insecure": True}}


def _check_complete(config):
    pipelines = config["service"]["pipelines"]
    used = {("extensions", e) for e in config["service"].get("extensions", [])}
    for signal, pipeline in pipelines.items():
        assert pipeline["receivers"] and pipeline["exporters"]
        assert pipeline["processors"][0] == "memory_limiter" and pipeline["processors"][-1] == "batch"
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline[kind]) <= set(config[kind]), (signal, kind)
            used |= {(kind, c) for c in pipeline[kind]}
    assert used == {(kind, cid) for kind, cid, _, _ in _components(config)}


# --- traces: the collector's trace flags ------------------------------------------------------------

@pytest.mark.parametrize("endpoint", [None, "jaeger:4317"])
@pytest.mark.parametrize("sampling", [None, TailSamplingConfig()])
@pytest.mark.parametrize("storage", [None, "/q"])
@pytest.mark.parametrize("traces_to", [(), ("grpc://j:4317",), ("grpc://j:4317", "http://t:4318", "https://h/x")])
def test_traces_pipeline_for_each_flag_combination(traces_to, storage, sampling, endpoint):
    kwargs = {"traces_to": traces_to, "traces_endpoint": endpoint, "storage_dir": storage, "tail_sampling": sampling}
    if not (traces_to or endpoint):
        if storage or sampling:
            with pytest.raises(ValueError, match="give traces_to or traces_endpoint"):
                otelcol_config("vllm", **kwargs)
        else:
            assert "traces" not in otelcol_config("vllm", **kwargs)["service"]["pipelines"]
        return
    config = otelcol_config("vllm", remote_write_urls=["http://p/api/v1/write"], **kwargs)
    _check_complete(config)
    pipeline = config["service"]["pipelines"]["traces"]
    assert pipeline["processors"] == ["memory_limiter", *(["tail_sampling"] if sampling else []), "batch"]
    assert config["service"]["pipelines"]["metrics"]["exporters"] == ["prometheus", "prometheusremotewrite/0"]
    kinds = {"grpc": "otlp", "http": "otlphttp", "https": "otlphttp"}
    want = [f"{kinds[url.split(':')[0]]}/{i}" for i, url in enumerate(traces_to)]
    want += ["otlp/traces"] if endpoint else []
    assert pipeline["exporters"] == want
    for cid in want:
        body = config["exporters"][cid]
        assert body.get("sending_queue") == ({"storage": "file_storage"} if storage else None)
    assert config.get("extensions") == ({"file_storage": {"directory": storage}} if storage else None)
    assert config["service"].get("extensions") == (["file_storage"] if storage else None)


def test_trace_exporters_endpoints():
    config = otelcol_config("vllm", traces_to=("grpc://jaeger:4317", "http://tempo:4318", "https://h:443/otlp/v1/t"),
                            traces_endpoint="https://tempo.example:443")
    assert config["exporters"] == {
        **{k: v for k, v in config["exporters"].items() if k == "prometheus"},
        "otlp/0": {"endpoint": "jaeger:4317", "tls": {"insecure": True}},
        "otlphttp/1": {"traces_endpoint": "http://tempo:4318/v1/traces"},  # as our collector appends it
        "otlphttp/2": {"traces_endpoint": "https://h:443/otlp/v1/t"},
        "otlp/traces": {"endpoint": "https://tempo.example:443", "tls": {"insecure": False}}}


def test_tail_sampling_settings_and_thresholds():
    sampling = TailSamplingConfig(decision_wait_s=2.5, ttft_above_s=0.5, e2e_above_s=None, queue_above_s=5,
                                  keep_fraction=0.1, max_traces=1000, decided_cache=5000)
    body = otelcol_config("vllm", traces_to=("grpc://j:4317",), tail_sampling=sampling)["processors"]["tail_sampling"]
    assert {k: v for k, v in body.items() if k != "policies"} == {
        "decision_wait": "2.5s", "decision_wait_after_root_received": "1s", "num_traces": 1000,
        "decision_cache": {"sampled_cache_size": 5000, "non_sampled_cache_size": 5000}}
    names = [p["name"] for p in body["policies"]]
    assert names == ["error", "error_type", "preempted", "slow_ttft", "slow_queue", "sampled"]  # e2e: off
    span_conditions = {p["name"]: p["ottl_condition"]["span"] for p in body["policies"] if "span" in
                       p.get("ottl_condition", {})}
    assert span_conditions["slow_ttft"] == ['attributes["gen_ai.latency.time_to_first_token"] > 0.5']
    assert span_conditions["slow_queue"] == ['attributes["gen_ai.latency.time_in_queue"] > 5.0']
    assert body["policies"][-1]["probabilistic"] == {"sampling_percentage": 10.0}
    none = TailSamplingConfig(ttft_above_s=None, e2e_above_s=None, queue_above_s=None, keep_fraction=0.0)
    body = otelcol_config("vllm", traces_to=("grpc://j:4317",), tail_sampling=none)["processors"]["tail_sampling"]
    assert [p["name"] for p in body["policies"]] == ["error", "error_type", "preempted"]


# A tiny interpreter for exactly the policies the generator emits: status_code, ottl_condition with
# `attributes["k"] != nil`, `attributes["k"] > <float>` (span) and `name == "x"` (spanevent). OTTL
# compares an int attribute with a float as float64, and a missing one (nil) is never `>`
# (pkg/ottl/LANGUAGE.md, Comparison Rules); the conditions of one policy are ORed (ottl.go).
_SPAN_CONDITION = re.compile(rf"^attributes\[{_STR}\] (!= nil|> (\d+\.\d+))$")
_EVENT_CONDITION = re.compile(rf"^name == {_STR}$")
_STATUS = {"OK": Status.STATUS_CODE_OK, "ERROR": Status.STATUS_CODE_ERROR, "UNSET": Status.STATUS_CODE_UNSET}


def _attribute(span, key):
    for kv in span.attributes:
        if kv.key == key:
            return getattr(kv.value, kv.value.WhichOneof("value"))
    return None


def _span_holds(condition, span):
    m = _SPAN_CONDITION.match(condition)
    assert m, f"unsupported OTTL span condition {condition!r}"
    value = _attribute(span, _unquote(m.group(1)))
    if m.group(2) == "!= nil":
        return value is not None
    return isinstance(value, (int, float)) and value > float(m.group(3))


def _event_holds(condition, event):
    m = _EVENT_CONDITION.match(condition)
    assert m, f"unsupported OTTL spanevent condition {condition!r}"
    return event.name == _unquote(m.group(1))


def _policy_samples(policy, spans):
    if policy["type"] == "status_code":
        codes = {_STATUS[c] for c in policy["status_code"]["status_codes"]}
        return any(s.status.code in codes for s in spans)
    assert policy["type"] == "ottl_condition", policy
    body = policy["ottl_condition"]
    assert body["error_mode"] == "ignore" and set(body) <= {"error_mode", "span", "spanevent"}
    return any(any(_span_holds(c, s) for c in body.get("span", ())) or
               any(_event_holds(c, e) for e in s.events for c in body.get("spanevent", ())) for s in spans)


def _span(n, parent=b"", error=False, events=(), **attrs):
    kv = []
    for key, value in attrs.items():
        any_value = AnyValue(int_value=value) if isinstance(value, int) else (
            AnyValue(double_value=value) if isinstance(value, float) else AnyValue(string_value=value))
        kv.append(KeyValue(key=key.replace("__", "."), value=any_value))
    return Span(trace_id=bytes(16), span_id=n.to_bytes(8, "big"), parent_span_id=parent, name=f"s{n}",
                status=Status(code=Status.STATUS_CODE_ERROR if error else Status.STATUS_CODE_UNSET),
                attributes=kv, events=[Span.Event(name=e) for e in events])


ROOT = (1).to_bytes(8, "big")
TTFT, E2E, QUEUE = "gen_ai__latency__time_to_first_token", "gen_ai__latency__e2e", "gen_ai__latency__time_in_queue"
TRACE_CASES = {  # name -> the spans of one trace (the root first)
    "fine": [_span(1), _span(2, ROOT)],
    "child_error": [_span(1), _span(2, ROOT, error=True)],
    "abort": [_span(1, **{"error__type": "abort"})],
    "error_type_only": [_span(1), _span(2, ROOT, **{"error__type": "timeout"})],
    "preempted": [_span(1), _span(2, ROOT, events=("scheduled", "preempted"))],
    "other_event": [_span(1, events=("first_token",))],
    "slow_ttft": [_span(1, **{TTFT: 2.5})],
    "ttft_at_threshold": [_span(1, **{TTFT: 2.0})],
    "fast_ttft": [_span(1, **{TTFT: 0.4}), _span(2, ROOT)],
    "slow_e2e": [_span(1, **{E2E: 61.0, TTFT: 0.1})],
    "slow_queue_int": [_span(1, **{QUEUE: 6})],  # an int attribute: both compare it as a number
    "latency_as_string": [_span(1, **{TTFT: "9"})],
}


@pytest.mark.parametrize("sampling", [
    TailSamplingConfig(keep_fraction=0.0),
    TailSamplingConfig(ttft_above_s=0.3, e2e_above_s=None, queue_above_s=None, keep_fraction=0.0),
    TailSamplingConfig(ttft_above_s=None, e2e_above_s=60.5, queue_above_s=6.0, keep_fraction=0.0),
], ids=["defaults", "ttft_only", "e2e_queue"])
def test_tail_sampling_policies_keep_what_our_sampler_keeps(sampling):
    policies = otelcol_config("vllm", traces_to=("grpc://j:4317",), tail_sampling=sampling)[
        "processors"]["tail_sampling"]["policies"]
    for name, spans in TRACE_CASES.items():
        kept = []
        sampler = TailSampler(sampling, lambda payload, n: kept.append(n))
        sampler.consume([(b"r", b"s", span, span.SerializeToString()) for span in spans])
        sampler.flush()
        ours = bool(kept)
        theirs = any(_policy_samples(p, spans) for p in policies if p["type"] != "probabilistic")
        assert theirs == ours, (name, [k for k in sampler.stats().traces])


def _fnv1a_64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


def test_probabilistic_keeps_the_same_share_of_other_traces():
    """contrib: FNV-1a(salt + trace id) <= percentage of 2^64 (internal/sampling/probabilistic.go, default salt);
    ours: the id's lower 64 bits below keep_fraction of 2^64. Same share, different traces (the header says so)."""
    sampling = TailSamplingConfig(keep_fraction=0.25)
    policy = otelcol_config("vllm", traces_to=("grpc://j:4317",), tail_sampling=sampling)[
        "processors"]["tail_sampling"]["policies"][-1]
    assert policy == {"name": "sampled", "type": "probabilistic", "probabilistic": {"sampling_percentage": 25.0}}
    rng = random.Random(7)
    ids = [rng.randbytes(16) for _ in range(4000)]
    threshold = int((2**64 - 1) * policy["probabilistic"]["sampling_percentage"] / 100)
    theirs = {i for i in ids if _fnv1a_64(b"default-hash-seed" + i) <= threshold}
    ours = {i for i in ids if int.from_bytes(i[8:], "big") < int(sampling.keep_fraction * 2**64)}
    assert abs(len(theirs) - len(ours)) < 0.05 * len(ids)
    assert theirs != ours


def test_header_says_what_differs_for_traces():
    def header(**kwargs):
        return render_otelcol_config("vllm", **kwargs).split("\nreceivers:")[0]

    assert "Traces:" not in header()
    plain = header(traces_endpoint="jaeger:4317")
    assert "Traces:" in plain and "tail_sampling" not in plain and "file_storage" not in plain
    full = header(traces_to=("grpc://j:4317",), storage_dir="/q", tail_sampling=TailSamplingConfig())
    for words in ("file_storage", "the directory must exist", "FNV-1a", "TraceIdRatioBased",
                  "after a trace's root span arrives", "num_traces"):
        assert words in full, words


def test_extra_le_bounds_are_the_canonical_bounds_the_profile_drops():
    table = instrument_table(8192)
    for name in PROFILES:
        profile = get_profile(name)
        extra = extra_le_bounds(profile)
        header = render_otelcol_config(name).split("\nreceivers:")[0]
        for fam in profile.families:
            dropped = sorted(set(table[fam.canonical].buckets) - set(fam.buckets or table[fam.canonical].buckets))
            assert list(extra.get(fam.name, ())) == dropped
            assert (fam.name in header) == bool(dropped)
    assert "vllm:e2e_request_latency_seconds" in extra_le_bounds(get_profile("vllm"))


def test_bad_arguments_raise_naming_the_value():
    with pytest.raises(ValueError, match="'sglang-nope'"):
        otelcol_config("sglang-nope")
    for name in ("sglang", "tgi", "triton"):  # `part`, `scale`, `only`, copied families: no rename expresses them
        with pytest.raises(ValueError, match=f"profile '{name}': the otelcol-contrib config supports vllm and otel"):
            otelcol_config(name)
    with pytest.raises(ValueError, match="'prometheus:9090'"):
        otelcol_config("vllm", remote_write_urls=["prometheus:9090"])
    with pytest.raises(ValueError, match="memory_limit_mib=0"):
        otelcol_config("vllm", memory_limit_mib=0)
    with pytest.raises(ValueError, match="'jaeger:4317'"):
        otelcol_config("vllm", traces_to=["jaeger:4317"])
    with pytest.raises(ValueError, match="storage_dir='/q'"):
        otelcol_config("vllm", storage_dir="/q")
    with pytest.raises(ValueError, match="tail_sampling"):
        otelcol_config("vllm", tail_sampling=TailSamplingConfig())
    with pytest.raises(ValueError, match="storage_dir=''"):
        otelcol_config("vllm", traces_to=["grpc://j:4317"], storage_dir="")
