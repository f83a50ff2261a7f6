"""examples/compose, checked without Docker: files parse, every mount exists, the committed collector
config is the generated one, Prometheus accepts its config, dashboards query only names we expose."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from otel_llm.canonical.instruments import Kind, instrument_table
from otel_llm.collector.otelcol.config import target_name
from otel_llm.shim.profiles import get_profile

COMPOSE = Path(__file__).resolve().parents[2] / "examples" / "compose"
COMPOSE_CONFIG_ARGS = ("--print-otelcol-config", "--otelcol-traces-endpoint", "jaeger:4317")  # as README.md says
DASHBOARDS = sorted((COMPOSE / "grafana" / "dashboards").glob("*.json"))
# vllm: names a dashboard may query that our vllm profile does not expose, with the reason.
NOT_EXPOSED: dict[str, str] = {}


def _compose():
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def _exposed_vllm_names() -> set[str]:
    """Every Prometheus name the vllm profile exposes: families, counters' _total, histograms' series."""
    table, names = instrument_table(8192), set()
    for fam in get_profile("vllm").families:
        kind = table[fam.canonical].kind
        names.add(target_name(fam))
        if kind is Kind.HISTOGRAM:
            names |= {fam.name + s for s in ("_bucket", "_sum", "_count")}
    return names


def test_compose_parses_and_every_mounted_file_exists():
    services = _compose()["services"]
    assert {"otelcol", "prometheus", "jaeger", "grafana"} <= set(services)
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith("./"), (name, volume)
            assert (COMPOSE / source).exists(), (name, source)
        assert set(service.get("depends_on", [])) <= set(services)
    assert "--web.enable-remote-write-receiver" in services["prometheus"]["command"]
    assert any("otelcol-config.yaml" in v for v in services["otelcol"]["volumes"])


def test_committed_collector_config_is_the_generated_one():
    committed = (COMPOSE / "otelcol-config.yaml").read_text()
    printed = subprocess.run([sys.executable, "-m", "otel_llm", "collector", *COMPOSE_CONFIG_ARGS], check=True,
                             capture_output=True, text=True, timeout=60).stdout
    assert committed == printed, \
        "examples/compose/otelcol-config.yaml is stale: regenerate it as examples/compose/README.md says"
    config = yaml.safe_load(committed)
    assert config["exporters"]["otlp/traces"]["endpoint"] == "jaeger:4317"
    port = config["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]
    scrape = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())["scrape_configs"]
    assert [f"otelcol:{port}"] == [t for job in scrape for sc in job["static_configs"] for t in sc["targets"]]
    assert all(job["honor_labels"] for job in scrape)


def test_promtool_accepts_prometheus_config():
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    proc = subprocess.run(["promtool", "check", "config", str(COMPOSE / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_grafana_provisioning_parses():
    prov = COMPOSE / "grafana" / "provisioning"
    sources = yaml.safe_load((prov / "datasources" / "datasources.yaml").read_text())["datasources"]
    assert {(s["type"], s["uid"]) for s in sources} == {("prometheus", "prometheus"), ("jaeger", "jaeger")}
    providers = yaml.safe_load((prov / "dashboards" / "dashboards.yaml").read_text())["providers"]
    mounts = [v.split(":")[1] for v in _compose()["services"]["grafana"]["volumes"]]
    assert all(p["options"]["path"] in mounts for p in providers)


def _datasource_refs(node):
    if isinstance(node, dict):
        if isinstance(node.get("datasource"), dict):
            yield node["datasource"]
        for v in node.values():
            yield from _datasource_refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _datasource_refs(v)


def _exprs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "definition") and isinstance(v, str):
                yield v
            else:
                yield from _exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _exprs(v)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_uses_provisioned_prometheus_and_exposed_names(path):
    dashboard = json.loads(path.read_text())
    # a provisioned uid, or a datasource-type template variable (vLLM's own dashboard uses ${DS_PROMETHEUS})
    variables = {f"${{{v['name']}}}" for v in dashboard.get("templating", {}).get("list", [])
                 if v.get("type") == "datasource" and v.get("query") == "prometheus"}
    refs = [r for r in _datasource_refs(dashboard) if r.get("type") == "prometheus"]
    assert refs and all(r["uid"] in {"prometheus"} | variables for r in refs)
    names = {m for e in _exprs(dashboard) for m in re.findall(r"vllm:[a-zA-Z0-9_:]+", e)}
    assert names, path.name
    missing = names - _exposed_vllm_names() - set(NOT_EXPOSED)
    assert not missing, f"{path.name} queries names the vllm profile does not expose: {sorted(missing)}"


# Every vllm: name that vLLM's own dashboard queries (vllm-project/vllm @ 4b5c627c,
# examples/observability/prometheus_grafana/grafana.json; the file is not shipped here, see README.md).
VLLM_DASHBOARD_NAMES = {
    f"vllm:{n}" for n in (
        "e2e_request_latency_seconds_bucket", "e2e_request_latency_seconds_sum", "e2e_request_latency_seconds_count",
        "inter_token_latency_seconds_bucket", "inter_token_latency_seconds_sum", "inter_token_latency_seconds_count",
        "time_to_first_token_seconds_bucket", "time_to_first_token_seconds_sum", "time_to_first_token_seconds_count",
        "prompt_tokens_total", "generation_tokens_total", "num_requests_running", "num_requests_waiting",
        "kv_cache_usage_perc", "request_prompt_tokens_bucket", "request_generation_tokens_bucket",
        "request_success_total", "request_queue_time_seconds_sum", "request_prefill_time_seconds_sum",
        "request_decode_time_seconds_sum", "request_max_num_generation_tokens_sum")
}


def test_vllms_own_dashboard_finds_every_name_it_queries():
    assert VLLM_DASHBOARD_NAMES - _exposed_vllm_names() == set()
