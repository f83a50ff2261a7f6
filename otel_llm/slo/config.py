"""The SLO file: objectives per model (and optionally per LoRA adapter and operation) on TTFT, time
per output token, inter-token latency, end-to-end latency and the error ratio.

```yaml
objectives:
  - model: my-model            # optional: lora_adapter, operation
    ttft: {threshold: 0.5, target: 0.99}    # seconds; fraction of requests at or under it
    tpot: {threshold: 0.1, target: 0.95}    # a request's mean time per output token
    itl:  {threshold: 0.05, target: 0.99}   # per token: fraction of inter-token gaps at or under it
    e2e:  {threshold: 10,  target: 0.99}
    errors: {target: 0.999}                 # fraction of requests that did not end in error
period: 28d                    # optional: the error budget's period (default 28d)
```

`load_slo_config(path)` / `parse_slo_config(document)` validate everything and raise `SloConfigError`
naming the bad value by its place (``objectives[0].ttft.threshold: ...``). Reading a file needs
PyYAML (the ``slo`` extra; the ``collector`` extra has it too).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

LATENCY_KINDS = ("ttft", "tpot", "itl", "e2e")
KINDS = (*LATENCY_KINDS, "errors")
_SCOPE_KEYS = ("model", "lora_adapter", "operation")
_PERIOD = re.compile(r"([0-9]+)([mhdw])")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class SloConfigError(ValueError):
    """A bad SLO file; the message names the value and where it is."""


@dataclass(frozen=True)
class Objective:
    """One SLO: requests (of ``kind``) good when at or under ``threshold`` seconds (latency kinds)
    or not in error (``errors``, threshold None), ``target`` of them over the period."""
    kind: str
    target: float
    threshold: float | None = None


@dataclass(frozen=True)
class ObjectiveSet:
    """The objectives of one scope (model, LoRA adapter, operation; None = any)."""
    objectives: tuple[Objective, ...]
    model: str | None = None
    lora_adapter: str | None = None
    operation: str | None = None

    @property
    def scope(self) -> dict[str, str]:
        return {k: v for k, v in (("model", self.model), ("lora_adapter", self.lora_adapter),
                                  ("operation", self.operation)) if v is not None}


@dataclass(frozen=True)
class SloConfig:
    sets: tuple[ObjectiveSet, ...]
    period_s: int = 28 * 86400
    period: str = "28d"


def load_slo_config(path: str | Path) -> SloConfig:
    try:
        import yaml
    except ImportError:
        raise SloConfigError("reading an SLO file needs PyYAML: pip install 'otel-llm[slo]'") from None
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SloConfigError(f"cannot read the SLO file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SloConfigError(f"{path}: not YAML: {exc}") from None
    try:
        return parse_slo_config(document)
    except SloConfigError as exc:
        raise SloConfigError(f"{path}: {exc}") from None


def parse_slo_config(document) -> SloConfig:
    if not isinstance(document, dict):
        raise SloConfigError(f"the top level must be a mapping with 'objectives', got {type(document).__name__}")
    unknown = set(document) - {"objectives", "period"}
    if unknown:
        raise SloConfigError(f"unknown key(s) {', '.join(map(repr, sorted(unknown)))}; expected objectives, period")
    entries = document.get("objectives")
    if not isinstance(entries, list) or not entries:
        raise SloConfigError("'objectives' must be a non-empty list of objective sets")
    period, period_s = _period(document.get("period", "28d"))
    sets, scopes = [], set()
    for i, entry in enumerate(entries):
        where = f"objectives[{i}]"
        if not isinstance(entry, dict):
            raise SloConfigError(f"{where}: must be a mapping, got {type(entry).__name__}")
        unknown = set(entry) - set(_SCOPE_KEYS) - set(KINDS)
        if unknown:
            raise SloConfigError(f"{where}: unknown key(s) {', '.join(map(repr, sorted(unknown)))}; expected "
                                 f"{', '.join(_SCOPE_KEYS + KINDS)}")
        scope = {}
        for key in _SCOPE_KEYS:
            value = entry.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise SloConfigError(f"{where}.{key}: must be a non-empty string, got {value!r}")
            scope[key] = value
        objectives = tuple(_objective(f"{where}.{kind}", kind, entry[kind]) for kind in KINDS if kind in entry)
        if not objectives:
            raise SloConfigError(f"{where}: no objective; give at least one of {', '.join(KINDS)}")
        key = tuple(scope.values())
        if key in scopes:
            raise SloConfigError(f"{where}: a second objective set for the same scope {scope}")
        scopes.add(key)
        sets.append(ObjectiveSet(objectives, **scope))
    return SloConfig(tuple(sets), period_s, period)


def _objective(where: str, kind: str, spec) -> Objective:
    if not isinstance(spec, dict):
        raise SloConfigError(f"{where}: must be a mapping like {{threshold: 0.5, target: 0.99}}, got {spec!r}")
    allowed = {"target"} if kind == "errors" else {"threshold", "target"}
    unknown = set(spec) - allowed
    if unknown:
        raise SloConfigError(f"{where}: unknown key(s) {', '.join(map(repr, sorted(unknown)))}; expected "
                             f"{', '.join(sorted(allowed))}")
    target = spec.get("target")
    if not _number(target) or not 0 < target < 1:
        raise SloConfigError(f"{where}.target: must be a fraction between 0 and 1 (e.g. 0.99), got {target!r}")
    if kind == "errors":
        return Objective(kind, float(target))
    threshold = spec.get("threshold")
    if not _number(threshold) or threshold <= 0:
        raise SloConfigError(f"{where}.threshold: must be a positive number of seconds, got {threshold!r}")
    return Objective(kind, float(target), float(threshold))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _period(text) -> tuple[str, int]:
    m = _PERIOD.fullmatch(str(text))
    if m is None or int(m[1]) == 0:
        raise SloConfigError(f"period: must be a duration like 28d, 4w or 30d, got {text!r}")
    return str(text), int(m[1]) * _UNIT_S[m[2]]
