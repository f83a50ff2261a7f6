"""`promtool test rules` cases for the rules `rules.rules` writes: per objective, a test in which
only that objective's events break it (all of them bad, for 75 minutes) and exactly its alerts
fire (page: 1 h and 5 m over 14.4x the budget; ticket: 6 h and 30 m over 6x; a burn rate whose
threshold is 100 % or more cannot fire, so it is expected not to), and one in which every
objective is met and none fires. The input series are the profile's own names and labels, as
its /metrics shows them (`rules.sli` reads the same shim table), one sample a minute.
"""

from __future__ import annotations

from otel_llm.shim.profiles import get_profile
from otel_llm.slo.config import Objective, ObjectiveSet, SloConfig
from otel_llm.slo.rules import BURNS, _alert, _errors, _histogram, _selector, scope_labels, sli

RUN = "0+60x90"  # a counter growing 60 a minute (1/s) for 90 minutes
FLAT = "0+0x90"
EVAL = "75m"


def rule_tests(config: SloConfig, profile_name: str, rule_file: str) -> dict:
    """The promtool test file (a dict to dump as YAML) for ``config``'s rules in ``rule_file``."""
    profile = get_profile(profile_name)
    every = [(scope, objective) for scope in config.sets for objective in scope.objectives]
    tests = []
    for broken in [*every, None]:
        series = []
        for scope, objective in every:
            sli(profile, scope, objective)  # (refuses what the rules refuse)
            series += _series(profile, scope, objective, bad=(scope, objective) == broken)
        alerts = [] if broken is None else [
            {"exp_labels": alert["labels"], "exp_annotations": alert["annotations"]}
            for alert in (_alert(broken[0], broken[1], scope_labels(*broken), *burn) for burn in BURNS
                          if burn[1] * (1 - broken[1].target) < 1)]
        name = "every objective met: nothing fires" if broken is None else \
            f"{broken[1].kind} broken ({', '.join(f'{k} {v}' for k, v in broken[0].scope.items()) or 'all models'})" \
            ": its page and ticket alerts fire, no other"
        tests.append({"name": name, "interval": "1m", "input_series": series,
                      "alert_rule_test": [{"eval_time": EVAL, "alertname": "LLMSLOErrorBudgetBurn",
                                           "exp_alerts": alerts}]})
    return {"rule_files": [rule_file], "evaluation_interval": "1m", "tests": tests}


def _series(profile, scope: ObjectiveSet, objective: Objective, bad: bool) -> list[dict]:
    """The counters an objective's SLI reads: every event bad when ``bad``, none otherwise."""
    if objective.kind == "errors":  # bad: requests that ended in error; good: another family or reason
        bad_rate, total = _errors(profile, scope)
        name, labels = _parse_rate(bad_rate)
        others = [_parse_rate(part) for part in total.split(" + ") if _parse_rate(part)[0] != name]
        good = others[0] if others else (name, {**labels, list(labels)[-1]: '"stop"'})
        return [{"series": _name(name, labels), "values": RUN if bad else FLAT},
                {"series": _name(*good), "values": FLAT if bad else RUN}]
    fam = _histogram(profile, objective.kind)
    sel = dict(p.split("=", 1) for p in _selector(profile, fam, scope).split(",") if p)
    le = sli(profile, scope, objective)[0].split('le="', 1)[1].split('"', 1)[0]
    return [{"series": _name(f"{fam.name}_count", sel), "values": RUN},
            {"series": _name(f"{fam.name}_bucket", {**sel, "le": f'"{le}"'}), "values": FLAT if bad else RUN},
            {"series": _name(f"{fam.name}_bucket", {**sel, "le": '"+Inf"'}), "values": RUN}]


def _parse_rate(rate: str) -> tuple[str, dict[str, str]]:
    """`sum(rate(NAME{a="x",b="y"}[$WINDOW]))` -> (NAME, {a: '"x"', b: '"y"'})."""
    inner = rate.split("rate(", 1)[1].rsplit("[", 1)[0]
    name, _, rest = inner.partition("{")
    labels = dict(p.split("=", 1) for p in rest.rstrip("}").split(",") if p)
    return name, labels


def _name(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f"{k}={v}" for k, v in labels.items()) + "}" if labels else name
