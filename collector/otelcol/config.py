"""The OpenTelemetry Collector Contrib config that does, beyond one host, what `otel-llm collector` does.

`otelcol_config(profile)` builds it as plain data from the tables the server's own /metrics and our
collector use (`otel_llm.canonical.instruments`, `otel_llm.shim.profiles`; imported, never copied), so the three
cannot disagree on a name. `render_otelcol_config(...)` is the same as YAML for
`otelcol-contrib --config FILE`. Profiles `vllm` and `otel` only (`PROFILES`): the others copy one
instrument into several families, scale units, show a histogram's sum as a counter, count only some
finish reasons and name counters without `_total`, none of which a rename expresses.

Metrics pipeline: `otlp` -> `memory_limiter` -> [`filter`: canonical instruments the profile leaves
out] -> [`transform`: what `metricstransform` cannot express: attribute values a profile's value map
drops, the cache config's per-key labels] -> `metricstransform`: per family, the canonical name ->
the final Prometheus name, unexposed attributes summed away (`aggregate_labels`), the rest renamed
to the profile's labels, and each pipeline instrument (`otel_llm.pipeline.families`) -> its
vLLM-Omni family (`vllm_omni:`; under `otel`, its OTel name) with its labels -> `batch` ->
`prometheus` (scrape) and one `prometheusremotewrite` per URL.
Both exporters use `translation_strategy: UnderscoreEscapingWithoutSuffixes`, the one suffix-free
strategy remote-write 1.0 accepts, so vLLM's colons survive and nothing is appended: the renames
already produce the final names (counters with `_total`, histograms as vLLM names them). `job`,
`instance` and `target_info` come from the resource as the OTel specification says (both
exporters' default). The rename runs before `batch`: `metricstransform` aggregates only within
one batch, and one export request is one server's resource.

Component types keep their old names (`prometheusremotewrite`, `metricstransform`, `otlp`): the
2026 lower_snake_case names are only aliases in newer releases, while the old ones load in every
release that has `translation_strategy` on both exporters (contrib v0.151.0 or later, PR #47714);
newer releases log a deprecation warning. Remote-write uses the flat `endpoint` for the same reason
(the `http:` block exists only since v0.158.0).

Traces pipeline (with a trace backend; collector/otelcol_traces.py): `otlp` -> `memory_limiter` ->
[`tail_sampling`] -> `batch` -> one `otlp` / `otlphttp` exporter per backend, [their queues in
`file_storage`].
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from otel_llm.canonical.instruments import (
    CACHE_CONFIG_INFO, CACHE_CONFIG_PREFIX, DIMENSIONS, ENGINE_ATTRIBUTE, MODEL_ATTRIBUTE, PROVIDER_ATTRIBUTE, Kind,
    instrument_table,
)
from otel_llm.cli.tls import TlsConfig
from otel_llm.collector.exporter.otlp import OtlpExporterConfig
from otel_llm.collector.extension.auth import Authenticator, BearerTokenAuth
from otel_llm.collector.otelcol.traces import header_lines as _traces_header
from otel_llm.collector.otelcol.traces import traces_part
from otel_llm.collector.processor.metric_routes import collector_profile
from otel_llm.collector.processor.tail_sampling import TailSamplingConfig
from otel_llm.pipeline.families import FAMILIES as PIPELINE_FAMILIES
from otel_llm.pipeline.families import PipelineFamily
from otel_llm.shim.profile import Profile, ProfileFamily

TRANSLATION_STRATEGY = "UnderscoreEscapingWithoutSuffixes"
PROFILES = ("vllm", "otel")  # the profiles whose every family is a rename (see the module docstring)
_INSTRUMENTS = instrument_table(8192)  # names, kinds and dims do not depend on max_model_len


def _ottl(text: str) -> str:
    """An OTTL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def target_name(fam: ProfileFamily) -> str:
    """The final Prometheus name: suffixes are off, so a counter's `_total` is part of the rename."""
    return fam.name + "_total" if _INSTRUMENTS[fam.canonical].kind is Kind.COUNTER else fam.name


def extra_le_bounds(profile: Profile) -> dict[str, tuple[float, ...]]:
    """Per family, the canonical bucket bounds the profile's coarser buckets leave out: the real
    collector cannot re-bucket, so these `le` values appear there and not on our /metrics."""
    out = {}
    for fam in profile.families:
        if fam.buckets is not None:
            extra = tuple(b for b in _INSTRUMENTS[fam.canonical].buckets if b not in fam.buckets)
            if extra:
                out[fam.name] = extra
    return out


def _transform_statements(profile: Profile) -> list[str]:
    statements = []
    for fam in profile.families:
        where = f"metric.name == {_ottl(fam.canonical)}"
        if fam.canonical == CACHE_CONFIG_INFO:  # its labels: the cache config's keys, and the engine
            for attr in (MODEL_ATTRIBUTE, PROVIDER_ATTRIBUTE):
                statements.append(f"delete_key(attributes, {_ottl(attr)}) where {where}")
            prefix = _ottl("^" + re.escape(CACHE_CONFIG_PREFIX))
            statements.append(f'replace_all_patterns(attributes, "key", {prefix}, "") where {where}')
        for dim, (_, vmap) in fam.labels.items():
            for value in DIMENSIONS[dim]:
                if vmap(value) is None:  # the label is absent for this value; metricstransform then sums
                    statements.append(f"delete_key(attributes, {_ottl(dim)}) where {where}"
                                      f" and attributes[{_ottl(dim)}] == {_ottl(value)}")
    return statements


def _rename(old: str, new: str, values: dict[str, str] | None = None) -> list[dict]:
    if old == new and not values:
        return []
    op: dict = {"action": "update_label", "label": old}
    if old != new:
        op["new_label"] = new
    if values:
        op["value_actions"] = [{"value": v, "new_value": nv} for v, nv in values.items()]
    return [op]


def _transform(profile: Profile, fam: ProfileFamily) -> dict:
    ops: list[dict] = []
    # The family's own base labels, if it has them (vLLM's frontend counters: no engine; engines summed).
    base = {MODEL_ATTRIBUTE: profile.model_label, ENGINE_ATTRIBUTE: profile.engine_label} if fam.base is None else {
        {"model": MODEL_ATTRIBUTE, "engine": ENGINE_ATTRIBUTE}[f]: label for label, f in fam.base}
    if fam.canonical != CACHE_CONFIG_INFO:  # its keys are the engine's cache config, not known here
        kept = [*base, *fam.labels]
        ops.append({"action": "aggregate_labels", "label_set": kept, "aggregation_type": "sum"})
        ops += _rename(MODEL_ATTRIBUTE, base[MODEL_ATTRIBUTE])
    if ENGINE_ATTRIBUTE in base:
        ops += _rename(ENGINE_ATTRIBUTE, base[ENGINE_ATTRIBUTE])
    for dim, (label, vmap) in fam.labels.items():
        changed = {v: vmap(v) for v in DIMENSIONS[dim] if vmap(v) not in (None, v)}
        ops += _rename(dim, label, changed)
    return {"include": fam.canonical, "match_type": "strict", "action": "update", "new_name": target_name(fam),
            "operations": ops}


def _pipeline_transform(profile: Profile, fam: PipelineFamily) -> dict:
    """A pipeline instrument -> its vLLM-Omni family and labels (profile `otel`: its OTel Prometheus name)."""
    name, labels = fam.exposed(otel=profile.name == "otel")
    ops = [op for attr, label in zip(fam.attributes, labels) for op in _rename(attr, label)]
    return {"include": fam.otel, "match_type": "strict", "action": "update",
            "new_name": name + "_total" if fam.kind is Kind.COUNTER else name, "operations": ops}


def otelcol_config(profile_name: str = "vllm", *, otlp_grpc_endpoint: str = "0.0.0.0:4317",
                   otlp_http_endpoint: str = "0.0.0.0:4318", prometheus_endpoint: str = "0.0.0.0:9464",
                   remote_write_urls: Sequence[str] = (), traces_to: Sequence[str] = (),
                   traces_endpoint: str | None = None, storage_dir: str | None = None,
                   tail_sampling: TailSamplingConfig | None = None, memory_limit_mib: int = 512,
                   metrics_to: Sequence[str] = (), tls: TlsConfig | None = None,
                   auth: Authenticator | None = None) -> dict:
    """The otelcol-contrib config as plain data (dicts, lists, strings, ints, floats).

    `remote_write_urls`: Prometheus remote-write 1.0 endpoints (e.g. http://prometheus:9090/api/v1/write),
    one exporter each. `metrics_to`: OTLP metric backends, fed by a pipeline of their own with the
    canonical names as received (no renames). Traces (collector/otelcol_traces.py), as `otel-llm collector` takes them:
    `traces_to` backend URLs (http(s)://host:port[/path] or grpc://host:port), `storage_dir` for their
    queues, `tail_sampling`; `traces_endpoint`: also host:port of an OTLP/gRPC backend, plain text
    unless it starts with https://. No traces pipeline without a backend. `tls` and `auth`: the
    listeners' (`tls` on the receivers and the prometheus exporter; `auth` on the receivers, as the
    bearertokenauth/server or basicauth/server extension).
    Raises ValueError naming a bad profile (or one of `PROFILES`' others), URL, memory limit, or trace flags
    without a backend.
    """
    profile = collector_profile(profile_name)
    if profile_name not in PROFILES:
        raise ValueError(f"profile {profile_name!r}: the otelcol-contrib config supports {' and '.join(PROFILES)} "
                         "only (its families scale units, copy and filter series, which otelcol-contrib's renames "
                         f"cannot express); `otel-llm collector --metrics-compat {profile_name}` serves them")
    traces = traces_part(traces_to, traces_endpoint, storage_dir, tail_sampling)
    if memory_limit_mib < 1:
        raise ValueError(f"memory_limit_mib={memory_limit_mib}: must be >= 1")
    for url in remote_write_urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"remote-write URL {url!r}: must start with http:// or https://")

    processors: dict = {"memory_limiter": {"check_interval": "1s", "limit_mib": memory_limit_mib,
                                           "spike_limit_mib": memory_limit_mib // 5}}
    metric_processors = ["memory_limiter"]
    exposed = {f.canonical for f in profile.families}
    dropped = [name for name in _INSTRUMENTS if name not in exposed]
    if dropped:
        processors[f"filter/{profile.name}"] = {
            "error_mode": "ignore", "metrics": {"metric": [f"name == {_ottl(n)}" for n in dropped]}}
        metric_processors.append(f"filter/{profile.name}")
    statements = _transform_statements(profile)
    if statements:
        processors[f"transform/{profile.name}"] = {
            "error_mode": "ignore", "metric_statements": [{"context": "datapoint", "statements": statements}]}
        metric_processors.append(f"transform/{profile.name}")
    processors[f"metricstransform/{profile.name}"] = {"transforms": [_transform(profile, f) for f in profile.families]
                                                      + [_pipeline_transform(profile, f) for f in PIPELINE_FAMILIES]}
    metric_processors += [f"metricstransform/{profile.name}", "batch"]
    processors["batch"] = {}

    exporters: dict = {"prometheus": {"endpoint": prometheus_endpoint, "enable_open_metrics": True,
                                      "metric_expiration": "5m", "translation_strategy": TRANSLATION_STRATEGY,
                                      "without_scope_info": True}}
    for i, url in enumerate(remote_write_urls):
        exporters[f"prometheusremotewrite/{i}"] = {"endpoint": url, "translation_strategy": TRANSLATION_STRATEGY,
                                                   "disable_scope_info": True}
    pipelines = {"metrics": {"receivers": ["otlp"], "processors": metric_processors, "exporters": list(exporters)}}
    otlp_metrics = {}
    for i, url in enumerate(metrics_to):
        exporter = OtlpExporterConfig(url, signal="metrics")
        otlp_metrics[f"otlp/metrics/{i}" if exporter.grpc else f"otlphttp/metrics/{i}"] = (
            {"endpoint": exporter.endpoint, "tls": {"insecure": True}} if exporter.grpc
            else {"metrics_endpoint": exporter.endpoint})
    if otlp_metrics:
        exporters.update(otlp_metrics)
        pipelines["metrics/otlp"] = {"receivers": ["otlp"], "processors": ["memory_limiter", "batch"],
                                     "exporters": list(otlp_metrics)}
    protocols = {"grpc": {"endpoint": otlp_grpc_endpoint}, "http": {"endpoint": otlp_http_endpoint}}
    config: dict = {"receivers": {"otlp": {"protocols": protocols}}, "processors": processors, "exporters": exporters}
    service: dict = {}
    extensions = _listener_security(tls, auth, [*protocols.values(), exporters["prometheus"]])
    if traces is not None:
        processors.update(traces.processors)
        exporters.update(traces.exporters)
        pipelines["traces"] = {"receivers": ["otlp"], "processors": ["memory_limiter", *traces.processors, "batch"],
                               "exporters": list(traces.exporters)}
        extensions.update(traces.extensions)
    if extensions:
        config["extensions"] = extensions
        service["extensions"] = list(extensions)
    config["service"] = {**service, "pipelines": pipelines}
    return config


def _listener_security(tls: TlsConfig | None, auth: Authenticator | None, listeners: list[dict]) -> dict:
    """Sets the Contrib's `tls` on every listener and `auth` on the receivers (the first two);
    returns the authenticator extension it names."""
    if tls is not None:
        settings = {"cert_file": tls.cert_file, "key_file": tls.key_file}
        if tls.client_ca_file is not None:
            settings["client_ca_file"] = tls.client_ca_file
        for listener in listeners:
            listener["tls"] = dict(settings)
    if auth is None:
        return {}
    name, extension = (("bearertokenauth/server", {"filename": auth.path}) if isinstance(auth, BearerTokenAuth)
                       else ("basicauth/server", {"htpasswd": {"file": auth.path}}))
    for receiver in listeners[:2]:
        receiver["auth"] = {"authenticator": name}
    return {name: extension}


def _header(profile: Profile, traces: list[str]) -> str:
    lines = [
        f"OpenTelemetry Collector Contrib config for the otel-llm `{profile.name}` metric names, generated by",
        f"`otel-llm collector --print-otelcol-config --metrics-compat {profile.name}` from the same tables as",
        "the servers' own /metrics and `otel-llm collector`. Regenerate it rather than editing it.",
        "Run: otelcol-contrib --config FILE   (contrib v0.151.0 or later)",
        "",
        "What this collector does not do that `otel-llm collector` does:",
        "- scope labels: off for every metric here (without_scope_info / disable_scope_info) so profile",
        "  series match the server's exactly; ours keeps otel_scope_* on metrics outside the profile.",
        "- other applications' metrics get no unit or _total suffixes here (the translation strategy is",
        "  global); ours adds them per the OTel specification.",
        "- no per-metric cardinality limit with an otel_metric_overflow series.",
    ]
    if profile.emit_empty:
        lines.append("- no zero-valued pre-created series: a label combination appears with its first data point.")
    extra = extra_le_bounds(profile)
    if extra:
        lines.append("- no re-bucketing: these families keep the canonical buckets, so they carry extra `le` bounds")
        lines.append("  (counts at the shared bounds are equal, so histogram_quantile still works):")
        lines += [f"    {name}: {', '.join(f'{b:g}' for b in bounds)}" for name, bounds in extra.items()]
    lines += traces
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def render_otelcol_config(profile_name: str = "vllm", **kwargs) -> str:
    """`otelcol_config(profile_name, **kwargs)` as YAML text, with a header saying how it was made and how to run it."""
    import yaml  # PyYAML: only the printed config needs it

    config = otelcol_config(profile_name, **kwargs)
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=4096)
    notes = _traces_header(config)
    if any("auth" in protocol for protocol in config["receivers"]["otlp"]["protocols"].values()):
        notes = ["- the prometheus exporter's /metrics is not behind the authenticator here (ours is).", *notes]
    return _header(collector_profile(profile_name), notes) + body
