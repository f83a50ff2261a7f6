"""Prometheus recording rules and multi-window, multi-burn-rate alerts for an SLO file, in any
profile's names, generated from the shim tables (so a rule and the /metrics it reads cannot drift).

Per objective, the SLI's error ratio (the fraction of bad events) is recorded at the windows of the
SRE workbook's alerts and over the SLO period: ``slo:error_ratio:rate5m`` ... ``rate6h`` and
``slo:error_ratio:rate<period>``, labelled ``slo`` (ttft|tpot|itl|e2e|errors) and the objective's
scope (``model``, ``operation``). A latency SLI is the fraction of requests (of tokens, for itl)
above the threshold, read from the family's histogram buckets: the threshold must be a bucket
boundary of that family (in its unit: Triton's TTFT is in ms), else `SloRuleError` names the
nearest boundaries; a ratio over buckets between two boundaries would be a guess. The errors SLI is
the fraction of finished requests that ended in error (not aborted by their client).

Alerts (``LLMSLOErrorBudgetBurn``): page when both the 1 h and 5 m error ratios exceed 14.4x the
budget (1 - target: 2 % of a 30-day budget in an hour), ticket when the 6 h and 30 m ones exceed 6x
(5 % in six hours); ``for`` 2 m and 15 m. A window without requests has no ratio (a division by
zero is no sample) and fires nothing. `rule_tests` writes `promtool test rules` cases for the same
rules: per objective a breaking series that must fire and a healthy one that must not.
"""

from __future__ import annotations

import math
from dataclasses import replace

from otel_llm.canonical import instruments as I
from otel_llm.export.exposition import format_value
from otel_llm.shim.profile import Profile, ProfileFamily
from otel_llm.shim.profiles import get_profile
from otel_llm.slo.config import Objective, ObjectiveSet, SloConfig

WINDOWS = ("5m", "30m", "1h", "6h")
BURNS = (("page", 14.4, "1h", "5m", "2m"), ("ticket", 6.0, "6h", "30m", "15m"))  # severity, factor, long, short, for
CANONICAL = {"ttft": "gen_ai.server.time_to_first_token", "tpot": "gen_ai.server.time_per_output_token",
              "itl": "otel_llm.request.inter_token_latency", "e2e": "gen_ai.server.request.duration"}
WHAT = {"ttft": "time to first token", "tpot": "time per output token", "itl": "inter-token latency",
         "e2e": "end-to-end latency", "errors": "requests without error"}


_W = "$WINDOW"  # the rate window's place in an SLI's expressions


class SloRuleError(ValueError):
    """An objective the profile cannot express; the message says why and what would."""


def record_name(window: str) -> str:
    return f"slo:error_ratio:rate{window}"


def rules(config: SloConfig, profile_name: str) -> dict:
    """The Prometheus rule file (as a dict to dump as YAML) for ``config`` in ``profile_name``'s names."""
    profile = get_profile(profile_name)
    if not profile.model_label and sum(s.model is not None for s in config.sets) > 1:
        raise SloRuleError(f"profile {profile.name} names no model in its metrics (one server, one model): give "
                           "one objective set per rule file")
    recording, alerting = [], []
    for objectives in config.sets:
        for objective in objectives.objectives:
            bad, total = sli(profile, objectives, objective)
            labels = scope_labels(objectives, objective)
            for window in (*WINDOWS, config.period):
                recording.append({"record": record_name(window),
                                  "expr": f"({bad}) / ({total})".replace(_W, window),
                                  "labels": dict(labels)})
            alerting += [_alert(objectives, objective, labels, *burn) for burn in BURNS]
    return {"groups": [{"name": f"otel-llm-slo-{profile.name}-sli", "rules": recording},
                       {"name": f"otel-llm-slo-{profile.name}-alerts", "rules": alerting}]}


def expressible(config: SloConfig, profile_name: str) -> tuple[SloConfig, list[str]]:
    """`config` without the objectives the profile cannot express, and why each was left out
    (`--skip-unsupported`); `SloRuleError` if none is left."""
    profile = get_profile(profile_name)
    sets, skipped = [], []
    for scope in config.sets:
        kept = []
        for objective in scope.objectives:
            try:
                sli(profile, scope, objective)
                kept.append(objective)
            except SloRuleError as exc:
                skipped.append(str(exc))
        if kept:
            sets.append(replace(scope, objectives=tuple(kept)))
    if not sets:
        raise SloRuleError(f"profile {profile_name} can express none of the objectives: " + "; ".join(skipped))
    return replace(config, sets=tuple(sets)), skipped


def sli(profile: Profile, scope: ObjectiveSet, objective: Objective) -> tuple[str, str]:
    """(bad, total) PromQL rates with `_W` for the window: the objective's events in the profile."""
    if scope.lora_adapter is not None:
        raise SloRuleError(f"lora_adapter {scope.lora_adapter!r}: no profile exports latency or errors per LoRA "
                           "adapter; give the objective per model")
    if objective.kind == "errors":
        return _errors(profile, scope)
    fam = _histogram(profile, objective.kind)
    inst = I.instrument_table(8192)[fam.canonical]  # (latency buckets do not depend on the model length)
    bounds = fam.buckets if fam.buckets is not None else tuple(b * fam.scale for b in inst.buckets)
    threshold = objective.threshold * fam.scale
    le = next((b for b in bounds if math.isclose(b, threshold, rel_tol=1e-9)), None)
    if le is None:
        below = max((b for b in bounds if b < threshold), default=None)
        above = min((b for b in bounds if b > threshold), default=None)
        near = " and ".join(format_value(b / fam.scale) for b in (below, above) if b is not None)
        raise SloRuleError(f"{objective.kind} threshold {format_value(objective.threshold)} s is not a bucket "
                           f"boundary of {fam.name} (profile {profile.name}); the nearest are {near} s: use one "
                           "of them, or add the threshold to the family's buckets (--custom-histogram-buckets)")
    sel = _selector(profile, fam, scope)
    le_sel = _join(sel, 'le="' + format_value(le) + '"')
    count = f"sum(rate({fam.name}_count{{{sel}}}[{_W}]))"
    good = f"sum(rate({fam.name}_bucket{{{le_sel}}}[{_W}]))"
    return f"{count} - {good}", count


def _histogram(profile: Profile, kind: str) -> ProfileFamily:
    canonical = CANONICAL[kind]
    for fam in profile.families:
        if fam.canonical == canonical and fam.part is None:
            return fam
    raise SloRuleError(f"{kind}: profile {profile.name} exposes no histogram of {WHAT[kind]} "
                       f"({canonical}); drop the objective or use the vllm or otel profile")


def _errors(profile: Profile, scope: ObjectiveSet) -> tuple[str, str]:
    """Requests that ended in error over those that finished, from the finished-request counters."""
    finished = [f for f in profile.families if f.canonical == "otel_llm.request.finished" and f.part is None]
    bad_fam = next((f for f in finished if "otel_llm.finish_reason" in f.labels
                    and f.labels["otel_llm.finish_reason"][1]("error") is not None), None)
    if bad_fam is None:
        raise SloRuleError(f"errors: profile {profile.name} counts no requests that ended in error "
                           "(SGLang counts aborted ones only); drop the objective or use another profile")
    label, value = bad_fam.labels["otel_llm.finish_reason"][0], bad_fam.labels["otel_llm.finish_reason"][1]("error")
    totals = [f for f in finished if not f.only] or \
        [next(f for f in finished if "error" not in f.only.get("otel_llm.finish_reason", ())), bad_fam]
    suffix = profile.counter_suffix

    def rate(fam: ProfileFamily, extra: str = "") -> str:
        return f"sum(rate({fam.name}{suffix}{{{_join(_selector(profile, fam, scope), extra)}}}[{_W}]))"
    # (a profile that exports only series with data, as OTel's, has no error series until the first error)
    bad = rate(bad_fam, f'{label}="{value}"')
    return f"({bad} or vector(0))", " + ".join(rate(f) for f in totals)


def _selector(profile: Profile, fam: ProfileFamily, scope: ObjectiveSet) -> str:
    parts = []
    if scope.model is not None and profile.model_label:  # (TGI's families name no model: one per server)
        parts.append(f'{profile.model_label}="{escape(scope.model)}"')
    if scope.operation is not None:
        label = fam.labels.get("gen_ai.operation.name")
        if label is None:
            raise SloRuleError(f"operation {scope.operation!r}: {fam.name} (profile {profile.name}) has no operation "
                               "label; give the objective per model, or use the otel profile")
        parts.append(f'{label[0]}="{escape(scope.operation)}"')
    return ",".join(parts)


def _join(*parts: str) -> str:
    return ",".join(p for p in parts if p)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def scope_labels(scope: ObjectiveSet, objective: Objective) -> dict[str, str]:
    return {"slo": objective.kind, **{k: v for k, v in scope.scope.items() if k != "lora_adapter"}}


def _alert(scope: ObjectiveSet, objective: Objective, labels: dict, severity: str, factor: float, long: str,
           short: str, wait: str) -> dict:
    budget = 1 - objective.target
    limit = format_value(round(factor * budget, 12))
    match = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
    what = WHAT[objective.kind] + (f" <= {format_value(objective.threshold)} s" if objective.threshold else "")
    target = f"{objective.target * 100:.10g}"
    where = ", ".join(f"{k} {v}" for k, v in scope.scope.items()) or "all models"
    return {"alert": "LLMSLOErrorBudgetBurn",
            "expr": f"{record_name(long)}{{{match}}} > {limit} and {record_name(short)}{{{match}}} > {limit}",
            "for": wait, "labels": {**labels, "severity": severity, "burn": format_value(factor)},
            "annotations": {"summary": f"{where}: {objective.kind} SLO ({what} for {target}% of requests) burning its "
                                       f"error budget {format_value(factor)}x too fast",
                            "description": f"The fraction of bad {'requests' if objective.kind != 'itl' else 'tokens'} "
                                           f"over both the last {long} and {short} exceeds {format_value(factor)} x "
                                           f"the error budget ({format_value(round(budget, 12))})."}}
