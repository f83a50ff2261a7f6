"""The collector's Prometheus exposition: text 0.0.4 and OpenMetrics 1.0 from the store.

Written like the server's renderer (`otel_llm.exposition`): each exposed series
caches its line prefixes (name, labels, `le`), so a render formats numbers
only. Histograms are re-bucketed to the profile's bounds when the input's
bounds contain them (exact, as on the server); otherwise the input's bounds are
exposed. OpenMetrics carries, per bucket, the latest exemplar (trace_id,
span_id) of any input series summed into it. The caller holds `store.lock`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from collector.metric_store import Family, Group, MetricStore
from otel_llm.exposition import escape_label_value, format_value
from otel_llm.instruments import Kind


class SelfFamily(NamedTuple):
    """A family of the collector's own telemetry: samples are (label text, value)."""

    name: str
    kind: Kind
    help: str
    samples: tuple[tuple[str, float], ...]


def render(store: MetricStore, openmetrics: bool = False, own: tuple[SelfFamily, ...] = ()) -> bytes:
    lines: list[str] = []
    for family in store.families.values():
        _header(lines, family.name, family.kind, family.help, openmetrics)
        if family.kind is Kind.HISTOGRAM:
            for group in family.groups.values():
                _histogram(lines, family, group, openmetrics)
        else:
            sample = family.name + ("_total" if family.kind is Kind.COUNTER else "")
            for group in family.groups.values():
                prefix = group.cache
                if prefix is None:
                    prefix = group.cache = f"{sample}{{{group.labels}}} "
                lines.append(prefix + format_value(_number(family, group)))
    targets = [r.target_labels for r in store.resources.values() if r.num_series > 0]
    if targets:
        _header(lines, "target_info", Kind.GAUGE, "Target metadata", openmetrics)
        lines.extend(f"target_info{{{labels}}} 1" for labels in targets)
    for fam in own:
        _header(lines, fam.name, fam.kind, fam.help, openmetrics)
        sample = fam.name + ("_total" if fam.kind is Kind.COUNTER else "")
        lines.extend(f"{sample}{{{labels}}} {format_value(v)}" if labels else f"{sample} {format_value(v)}"
                     for labels, v in fam.samples)
    if openmetrics:
        lines.append("# EOF")
    lines.append("")
    return "\n".join(lines).encode()


def _header(lines: list[str], name: str, kind: Kind, help_text: str, openmetrics: bool) -> None:
    fname = name if (openmetrics or kind is not Kind.COUNTER) else name + "_total"
    lines.append(f"# HELP {fname} {escape_label_value(help_text)}")
    lines.append(f"# TYPE {fname} {kind.value}")


def _number(family: Family, group: Group) -> float:
    members = group.members
    if not members:
        return 0.0
    if family.kind is Kind.GAUGE:
        return max(members, key=lambda s: s.time_ns).value
    return sum(s.value for s in members)


def _histogram(lines: list[str], family: Family, group: Group, openmetrics: bool) -> None:
    members = [s for s in group.members if s.counts is not None]
    if not members:
        return
    counts = members[0].counts if len(members) == 1 else np.sum([s.counts for s in members], axis=0)
    total_sum = sum(s.sum for s in members)
    cache = group.cache
    if cache is None:
        cache = group.cache = _histogram_prefixes(family, group)
    prefixes, pos, p_sum, p_count = cache
    cum = np.cumsum(counts)
    values = cum[pos].tolist() + [int(cum[-1])] if len(cum) else [0]
    if openmetrics and any(s.exemplars for s in members):
        exemplars = _exemplars(members, pos, len(counts))
        lines.extend(p + str(v) + e for p, v, e in zip(prefixes, values, exemplars))
    else:
        lines.extend(p + str(v) for p, v in zip(prefixes, values))
    lines.append(p_sum + format_value(total_sum))
    lines.append(p_count + str(values[-1]))


def _histogram_prefixes(family: Family, group: Group):
    bounds = group.bounds
    wanted = np.asarray(family.buckets if family.buckets is not None else bounds, np.float64)
    pos = np.searchsorted(bounds, wanted)
    if len(pos) and (pos.max(initial=0) >= len(bounds) or not np.array_equal(bounds[pos], wanted)):
        wanted, pos = bounds, np.arange(len(bounds))  # not a subset: expose the input's own bounds
    sep = "," if group.labels else ""
    name, labels = family.name, group.labels
    prefixes = [f'{name}_bucket{{{labels}{sep}le="{format_value(b)}"}} ' for b in wanted.tolist()]
    prefixes.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} ')
    return prefixes, pos, f"{name}_sum{{{labels}}} ", f"{name}_count{{{labels}}} "


def _exemplars(members, pos: np.ndarray, num_buckets: int) -> list[str]:
    """Per exposed bucket, the latest exemplar among the input buckets it covers (or '')."""
    edges = pos.tolist() + [num_buckets - 1]
    out = []
    lo = 0
    for hi in edges:
        best = None
        for s in members:
            if s.exemplars:
                for bucket, ex in s.exemplars.items():
                    if lo <= bucket <= hi and (best is None or ex[2] > best[2]):
                        best = ex
        out.append("" if best is None else f" # {{{best[0]}}} {format_value(best[1])} {best[2] / 1e9:.3f}")
        lo = hi + 1
    return out
