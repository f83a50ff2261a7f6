"""The generated otelcol-contrib config: documented keys only, complete pipelines, and renames that
reproduce the server's own /metrics labels for every family of both profiles."""

import re

import pytest
import yaml

from collector.otelcol_config import extra_le_bounds, otelcol_config, render_otelcol_config, target_name
from otel_llm.exposition import _groups
from otel_llm.instruments import (
    CACHE_CONFIG_INFO, CACHE_CONFIG_PREFIX, DIMENSIONS, ENGINE_ATTRIBUTE, MODEL_ATTRIBUTE, PROVIDER_ATTRIBUTE, Kind,
    instrument_table,
)
from otel_llm.profiles import get_profile

PROFILES = ("vllm", "otel")
CORE, CONTRIB = "open-telemetry/opentelemetry-collector", "open-telemetry/opentelemetry-collector-contrib"

# Component type -> (every key path the generator may use, where it is documented). Paths are dotted;
# `[]` marks the items of a list. Read in the stored copies: core @v0.159.0 (934999fb), contrib from
# its file index (latest stored versions of each file).
DOCUMENTED = {
    ("receivers", "otlp"): (
        {"protocols.grpc.endpoint", "protocols.http.endpoint"},
        f"{CORE}: receiver/otlpreceiver/config.go (protocols.grpc, protocols.http), "
        "config/confignet/confignet.go (endpoint)"),
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
        {"endpoint", "enable_open_metrics", "metric_expiration", "translation_strategy", "without_scope_info"},
        f"{CONTRIB}: exporter/prometheusexporter/config.go, README.md"),
    ("exporters", "prometheusremotewrite"): (
        {"endpoint", "translation_strategy", "disable_scope_info"},
        f"{CONTRIB}: exporter/prometheusremotewriteexporter/config.go (flat client `endpoint`: deprecated "
        "v0.158.0 in favour of http.endpoint, still accepted), README.md"),
    ("exporters", "otlp"): (
        {"endpoint", "tls.insecure"},
        f"{CORE}: exporter/otlpexporter/config.go, config/configgrpc/configgrpc.go (endpoint, tls), "
        "config/configtls/generated_config.go (insecure)"),
}
ENUMS = {  # documented values of the enumerated keys used
    "translation_strategy": {"UnderscoreEscapingWithSuffixes", "UnderscoreEscapingWithoutSuffixes",
                             "NoUTF8EscapingWithSuffixes", "NoTranslation"},
    "match_type": {"strict", "regexp"},
    "aggregation_type": {"sum", "mean", "min", "max"},
    "error_mode": {"ignore", "silent", "propagate"},
    "context": {"resource", "scope", "metric", "datapoint"},
}
OTTL_FUNCTIONS = {"delete_key", "replace_all_patterns"}  # contrib pkg/ottl/ottlfuncs/README.md
SERVICE_KEYS = {"pipelines"}  # core service/config.go; pipeline keys: service/pipelines/config.go
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
    for kind in ("receivers", "processors", "exporters"):
        for cid, body in config[kind].items():
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
    """Attributes of every series of `inst` as the server sends them (otel_llm/bridge.py)."""
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
    config, profile = otelcol_config(profile_name), get_profile(profile_name)
    families = {f.canonical: f for f in profile.families}
    for inst in instrument_table(8192).values():
        got = {simulate(config, inst.name, a) for a in _points(inst)}
        fam = families.get(inst.name)
        if fam is None:
            assert got == {None}, inst.name
            continue
        base = ((profile.model_label, "m"), (profile.engine_label, "0"))
        if inst.name == CACHE_CONFIG_INFO:
            base = tuple(CACHE_CONFIG.items()) + ((profile.engine_label, "0"),)
        want = {(target_name(fam), frozenset(base + pairs)) for pairs, _ in _groups(inst, fam)}
        assert got == want, inst.name


@pytest.mark.parametrize("profile_name", PROFILES)
def test_renames_are_the_profiles(profile_name):
    config, profile = otelcol_config(profile_name), get_profile(profile_name)
    table = instrument_table(8192)
    transforms = config["processors"][f"metricstransform/{profile_name}"]["transforms"]
    assert [t["include"] for t in transforms] == [f.canonical for f in profile.families]
    for t, fam in zip(transforms, profile.families):
        suffix = "_total" if table[fam.canonical].kind is Kind.COUNTER else ""
        assert t["new_name"] == fam.name + suffix
        renames = {op["label"]: op["new_label"] for op in t["operations"] if "new_label" in op}
        want = {ENGINE_ATTRIBUTE: profile.engine_label, **{d: label for d, (label, _) in fam.labels.items()}}
        if fam.canonical != CACHE_CONFIG_INFO:
            want[MODEL_ATTRIBUTE] = profile.model_label
        assert renames == want


@pytest.mark.parametrize("profile_name", PROFILES)
def test_yaml_parses_and_uses_only_documented_keys(profile_name):
    text = render_otelcol_config(profile_name, remote_write_urls=["http://a:9090/api/v1/write"],
                                 traces_endpoint="jaeger:4317")
    assert "otelcol-contrib --config" in text.split("\nreceivers:")[0]
    config = yaml.safe_load(text)
    assert config == otelcol_config(profile_name, remote_write_urls=["http://a:9090/api/v1/write"],
                                    traces_endpoint="jaeger:4317")
    assert set(config) == {"receivers", "processors", "exporters", "service"}
    for kind, cid, ctype, body in _components(config):
        keys, source = DOCUMENTED[(kind, ctype)]
        used = {p for p in _paths(body) if p}
        assert used <= keys, f"{cid}: {used - keys} not documented in {source}"
        for path in used:
            leaf = path.rsplit(".", 1)[-1]
            if leaf in ENUMS:
                assert set(_leaf_values(body, path)) <= ENUMS[leaf], (cid, path)
    assert set(config["service"]) == SERVICE_KEYS
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
    pipelines = config["service"]["pipelines"]
    used = set()
    for signal, pipeline in pipelines.items():
        assert pipeline["receivers"] and pipeline["exporters"]
        assert pipeline["processors"][0] == "memory_limiter" and pipeline["processors"][-1] == "batch"
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline[kind]) <= set(config[kind]), (signal, kind)
            used |= {(kind, c) for c in pipeline[kind]}
    assert used == {(kind, cid) for kind, cid, _, _ in _components(config)}
    remote = [c for c in config["exporters"] if c.startswith("prometheusremotewrite/")]
    assert sorted(config["exporters"][c]["endpoint"] for c in remote) == sorted(urls)
    assert set(pipelines) == ({"metrics", "traces"} if traces else {"metrics"})
    if traces:
        assert config["exporters"]["otlp/traces"] == {"endpoint": traces, "tls": {"insecure": True}}


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
    with pytest.raises(ValueError, match="'prometheus:9090'"):
        otelcol_config("vllm", remote_write_urls=["prometheus:9090"])
    with pytest.raises(ValueError, match="memory_limit_mib=0"):
        otelcol_config("vllm", memory_limit_mib=0)
