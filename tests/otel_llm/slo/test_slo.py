"""SLOs as code: the SLO file validated naming the bad value; for every profile, rules generated from
its shim table that `promtool check rules` accepts and whose `promtool test rules` cases (each
objective broken alone fires exactly its alerts; all met fires none) pass; objectives a profile
cannot express refused with what would work (or left out and named, `--skip-unsupported`); the
shipped rules and dashboards are what the commands write."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from otel_llm.canonical import instruments as I
from otel_llm.shim.profiles import PROFILE_NAMES, get_profile
from otel_llm.slo.config import SloConfigError, load_slo_config, parse_slo_config
from otel_llm.slo.dashboard import queries
from otel_llm.slo.rule_tests import rule_tests
from otel_llm.slo.rules import CANONICAL, SloRuleError, rules

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples/slo"


def config_for(profile_name: str) -> dict:
    """Every objective the profile can express, each threshold one of its family's bucket boundaries,
    for two models (one scoped to an operation where the profile labels it)."""
    profile = get_profile(profile_name)
    entry: dict = {"model": "m1"}
    for kind, canonical in CANONICAL.items():
        fam = next((f for f in profile.families if f.canonical == canonical and f.part is None), None)
        if fam is not None:
            bounds = fam.buckets or tuple(b * fam.scale for b in I.instrument_table(8192)[canonical].buckets)
            entry[kind] = {"threshold": bounds[len(bounds) // 2] / fam.scale, "target": 0.99}
    if profile_name != "sglang":  # (SGLang counts aborted requests only)
        entry["errors"] = {"target": 0.999}
    if not profile.model_label:  # (TGI names no model: one server, one model)
        return {"objectives": [entry]}
    second = {**entry, "model": "m2"}
    if profile_name == "otel":  # per operation, where the family has the label (ITL has none)
        second = {k: v for k, v in second.items() if k != "itl"} | {"operation": "chat"}
    return {"objectives": [entry, second]}


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_every_profiles_rules_pass_promtools_check_and_unit_tests(profile, tmp_path):
    config = parse_slo_config(config_for(profile))
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules(config, profile), sort_keys=False, width=1000))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(rule_tests(config, profile, "rules.yml"), sort_keys=False,
                                                      width=1000))
    check = subprocess.run(["promtool", "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    kinds = sum(len(s.objectives) for s in config.sets)
    assert f"SUCCESS: {kinds * 7} rules found" in check.stdout  # 5 windows + 2 alerts per objective
    test = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout[-4000:] + test.stderr
    cases = yaml.safe_load((tmp_path / "test.yml").read_text())["tests"]
    assert len(cases) == kinds + 1 and cases[-1]["alert_rule_test"][0]["exp_alerts"] == []
    assert all(len(c["alert_rule_test"][0]["exp_alerts"]) == 2 for c in cases[:-1])  # page and ticket


def test_a_broken_rule_fails_its_unit_test(tmp_path):
    """(The cases can fail: the page alert's threshold raised tenfold, it no longer fires.)"""
    config = load_slo_config(EXAMPLES / "slo.yaml")
    text = yaml.safe_dump(rules(config, "vllm"), sort_keys=False, width=1000).replace("> 0.144 and", "> 1.44 and")
    (tmp_path / "rules.yml").write_text(text)
    (tmp_path / "test.yml").write_text(yaml.safe_dump(rule_tests(config, "vllm", "rules.yml"), sort_keys=False))
    test = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert test.returncode != 0 and "ttft broken" in test.stdout + test.stderr


def test_the_shipped_examples_are_what_the_command_writes(tmp_path):
    out = subprocess.run([sys.executable, "-m", "otel_llm", "slo", "rules", "--config", "slo.yaml", "--profile", "vllm",
                          "--out", str(tmp_path / "vllm.rules.yml"), "--test-out", str(tmp_path / "vllm.rules.test.yml")],
                         cwd=EXAMPLES, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "otel-llm slo rules: 28 rules for 1 objective set(s), profile vllm" in out.stderr
    for name in ("vllm.rules.yml", "vllm.rules.test.yml"):
        assert (tmp_path / name).read_text() == (EXAMPLES / name).read_text(), \
            f"examples/slo/{name} is stale: regenerate it (see its first line)"
    rules_doc = yaml.safe_load((EXAMPLES / "vllm.rules.yml").read_text())
    exprs = [r["expr"] for r in rules_doc["groups"][0]["rules"]]
    assert exprs[0] == ('(sum(rate(vllm:time_to_first_token_seconds_count{model_name="my-model"}[5m])) - '
                        'sum(rate(vllm:time_to_first_token_seconds_bucket{model_name="my-model",le="0.5"}[5m]))) / '
                        '(sum(rate(vllm:time_to_first_token_seconds_count{model_name="my-model"}[5m])))')
    assert any('vllm:request_success_total{model_name="my-model",finished_reason="error"}' in e for e in exprs)


@pytest.mark.parametrize("document, message", [
    ([], "the top level must be a mapping"),
    ({"objective": []}, "unknown key(s) 'objective'"),
    ({"objectives": []}, "'objectives' must be a non-empty list"),
    ({"objectives": [{"model": "m"}]}, "objectives[0]: no objective"),
    ({"objectives": [{"ttft": {"threshold": 0.5, "target": 99}}]}, "objectives[0].ttft.target: must be a fraction"),
    ({"objectives": [{"ttft": {"threshold": "fast", "target": 0.9}}]}, "objectives[0].ttft.threshold: must be a "
                                                                        "positive number of seconds, got 'fast'"),
    ({"objectives": [{"ttft": {"threshold": 0.5, "target": 0.9, "window": 3}}]}, "objectives[0].ttft: unknown key"),
    ({"objectives": [{"errors": {"target": 0.9, "threshold": 1}}]}, "objectives[0].errors: unknown key(s) 'threshold'"),
    ({"objectives": [{"model": "", "e2e": {"threshold": 1, "target": 0.9}}]}, "objectives[0].model: must be a "
                                                                               "non-empty string"),
    ({"objectives": [{"e2e": {"threshold": 1, "target": 0.9}}, {"e2e": {"threshold": 2, "target": 0.9}}]},
     "objectives[1]: a second objective set for the same scope"),
    ({"objectives": [{"e2e": {"threshold": 1, "target": 0.9}}], "period": "a month"}, "period: must be a duration"),
    ({"objectives": [{"ttfb": {"threshold": 1, "target": 0.9}}]}, "objectives[0]: unknown key(s) 'ttfb'"),
])
def test_a_bad_slo_file_is_refused_naming_the_value(document, message):
    with pytest.raises(SloConfigError) as exc:
        parse_slo_config(document)
    assert message in str(exc.value)


def test_reading_a_file_names_it(tmp_path):
    bad = tmp_path / "slo.yaml"
    bad.write_text("objectives:\n  - ttft: {threshold: 0.5, target: 1.5}\n")
    with pytest.raises(SloConfigError, match=r"slo.yaml: objectives\[0\].ttft.target"):
        load_slo_config(bad)
    with pytest.raises(SloConfigError, match="cannot read the SLO file"):
        load_slo_config(tmp_path / "absent.yaml")
    assert load_slo_config(EXAMPLES / "slo.yaml").period_s == 28 * 86400


@pytest.mark.parametrize("profile, entry, message", [
    ("vllm", {"ttft": {"threshold": 0.3, "target": 0.99}}, "ttft threshold 0.3 s is not a bucket boundary of "
     "vllm:time_to_first_token_seconds (profile vllm); the nearest are 0.25 and 0.5 s"),
    ("triton", {"ttft": {"threshold": 1, "target": 0.99}}, "nearest are 0.5 and 2.0 s"),  # Triton's ms buckets
    ("tgi", {"ttft": {"threshold": 0.5, "target": 0.99}}, "ttft: profile tgi exposes no histogram of time to first"),
    ("sglang", {"errors": {"target": 0.99}}, "errors: profile sglang counts no requests that ended in error"),
    ("vllm", {"operation": "chat", "ttft": {"threshold": 0.5, "target": 0.99}}, "operation 'chat': "
     "vllm:time_to_first_token_seconds (profile vllm) has no operation label"),
    ("vllm", {"lora_adapter": "a", "ttft": {"threshold": 0.5, "target": 0.99}}, "no profile exports latency or "
     "errors per LoRA adapter"),
])
def test_an_objective_a_profile_cannot_express_is_refused_with_what_would_work(profile, entry, message):
    with pytest.raises(SloRuleError) as exc:
        rules(parse_slo_config({"objectives": [entry]}), profile)
    assert message in str(exc.value)


def test_the_command_names_a_bad_file_and_exits_2(tmp_path):
    bad = tmp_path / "slo.yaml"
    bad.write_text("objectives:\n  - model: m\n    ttft: {threshold: 0.3, target: 0.99}\n")
    out = subprocess.run([sys.executable, "-m", "otel_llm", "slo", "rules", "--config", str(bad)], capture_output=True,
                         text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert "otel-llm slo rules: error: ttft threshold 0.3 s is not a bucket boundary" in out.stderr
    assert "Traceback" not in out.stderr


def test_skip_unsupported_leaves_out_and_names_what_a_profile_cannot_express(tmp_path):
    out = subprocess.run([sys.executable, "-m", "otel_llm", "slo", "rules", "--config", str(EXAMPLES / "slo.yaml"),
                          "--profile", "triton", "--skip-unsupported"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert {r["labels"]["slo"] for g in yaml.safe_load(out.stdout)["groups"] for r in g["rules"]} == {"ttft", "errors"}
    assert "left out: ttft threshold 0.5 s is not a bucket boundary" not in out.stderr  # (500 ms is Triton's)
    assert "left out: tpot: profile triton exposes no histogram" in out.stderr
    assert "left out: e2e: profile triton exposes no histogram" in out.stderr
    none = tmp_path / "slo.yaml"
    none.write_text("objectives:\n  - model: m\n    ttft: {threshold: 0.5, target: 0.99}\n")
    out = subprocess.run([sys.executable, "-m", "otel_llm", "slo", "dashboard", "--config", str(none), "--profile",
                          "tgi", "--skip-unsupported"], capture_output=True, text=True)
    assert out.returncode == 2 and "profile tgi can express none of the objectives" in out.stderr


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_the_shipped_dashboards_are_what_the_command_writes(profile, tmp_path):
    path = EXAMPLES / "dashboards" / f"{profile}.json"
    out = subprocess.run([sys.executable, "-m", "otel_llm", "slo", "dashboard", "--config", "slo.yaml", "--profile",
                          profile, "--skip-unsupported", "--out", str(tmp_path / "d.json")],
                         cwd=EXAMPLES, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "d.json").read_text() == path.read_text(), \
        f"examples/slo/dashboards/{profile}.json is stale: regenerate it (see its description)"
    board = json.loads(path.read_text())
    assert board["templating"]["list"][0] == {"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                                               "query": "prometheus"}
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids) and all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in board["panels"]
                                             if p["type"] != "row")
    # every query reads the profile's names or the rules' records (run against a real Prometheus in
    # tests/integration/test_slo_prometheus.py)
    names = {f.name for f in get_profile(profile, goodput=True).families}
    for q in queries(board):
        metric = re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\[)", q)
        assert metric and all(m.startswith("slo:error_ratio:") or m.removesuffix("_total").removesuffix("_bucket")
                              in names for m in metric), (q, metric)
