"""OTel -> Prometheus names, as the OTel specification's Prometheus compatibility
rules and their reference implementation (prometheus/otlptranslator, "underscore
escaping with suffixes", the Collector's default) write them.

- Metric names: split on every character outside ``[a-zA-Z0-9:]`` and re-joined
  with ``_`` (colons survive); the unit becomes a word suffix unless the name
  already has that word (``s`` -> ``seconds``; ``{...}`` annotations dropped;
  ``By/s`` -> ``bytes_per_second``); a gauge with unit ``1`` gets ``ratio``.
  Counters' ``total`` word is removed here: the exposition appends ``_total`` to
  the sample (and, in text 0.0.4, to the family).
- Label names: invalid characters -> ``_`` (runs collapsed), a leading digit gets
  ``key_``, a single leading underscore gets ``key``.
"""

from __future__ import annotations

import re

from otel_llm.canonical.instruments import Kind

_UNIT_WORDS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes",
    "GiBy": "gibibytes", "TiBy": "tibibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes",
    "TBy": "terabytes", "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts",
    "g": "grams", "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent",
}  # fmt: skip
_PER_UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}
_NAME_SPLIT = re.compile(r"[^a-zA-Z0-9:]+")
_LABEL_INVALID = re.compile(r"[^a-zA-Z0-9_]+")
_ANNOTATION = re.compile(r"\{[^}]*\}")


def _unit_words(unit: str) -> tuple[str, str]:
    """(main word, per word): ``"By/s"`` -> ``("bytes", "per_second")``; unknown units sanitized."""
    unit = _ANNOTATION.sub("", unit).strip()
    main, _, per = unit.partition("/")
    main_word = "_".join(t for t in _NAME_SPLIT.split(_UNIT_WORDS.get(main, main)) if t)
    per_word = "_".join(t for t in _NAME_SPLIT.split(_PER_UNIT_WORDS.get(per, per)) if t)
    return main_word, "per_" + per_word if per_word else ""


def metric_name(name: str, unit: str, kind: Kind) -> str:
    """The Prometheus family name of an OTel metric (counters without ``_total``)."""
    tokens = [t for t in _NAME_SPLIT.split(name) if t]
    if kind is Kind.COUNTER:
        tokens = [t for t in tokens if t != "total"]
    for word in _unit_words(unit):
        if word and word not in tokens:
            tokens.append(word)
    if kind is Kind.GAUGE and unit.strip() == "1" and "ratio" not in tokens:
        tokens.append("ratio")
    result = "_".join(tokens)
    if not result:
        raise ValueError(f"metric name {name!r} has no valid Prometheus characters")
    return "_" + result if result[0].isdigit() else result


def label_name(key: str) -> str:
    """The Prometheus label name of an OTel attribute key."""
    label = _LABEL_INVALID.sub("_", key)
    if not label.strip("_"):
        raise ValueError(f"attribute key {key!r} has no valid Prometheus label characters")
    if label[0].isdigit():
        return "key_" + label
    if label.startswith("_") and not label.startswith("__"):
        return "key" + label
    return label
