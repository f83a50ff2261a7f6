"""The collector's Prometheus exposition: text 0.0.4 and OpenMetrics 1.0 from the store.

Written like the server's renderer (`otel_llm.exposition`): each exposed series
caches its line prefixes (name, labels, `le`), so a render formats numbers
only. Histograms are re-bucketed to the profile's bounds when the input's
bounds contain them (exact, as on the server); otherwise the input's bounds are
exposed. OpenMetrics carries, per bucket, the latest exemplar (trace_id,
span_id) of any input series summed into it. The caller holds `store.lock`.
"""

from __future__ import annotations

import bisect
import operator

import numpy as np

from collector.metric_store import Family, Group, MetricStore
from otel_llm.exposition import SelfFamily, family_header, format_value, label_text, self_family_lines
from otel_llm.instruments import Kind


def render(store: MetricStore, openmetrics: bool = False, own: tuple[SelfFamily, ...] = ()) -> bytes:
    lines: list[str] = []
    for family in store.families.values():
        family_header(lines, family.name, family.kind, family.help, openmetrics)
        if family.kind is Kind.HISTOGRAM:
            _histograms(lines, family, openmetrics)
        else:
            sample = family.name + ("_total" if family.kind is Kind.COUNTER else "")
            for group in family.groups.values():
                prefix = group.cache
                if prefix is None:
                    prefix = group.cache = f"{sample}{{{group.labels}}} "
                lines.append(prefix + format_value(_number(family, group)))
    targets = [label_text(r.target_pairs) for r in store.resources.values() if r.num_series > 0]
    if targets:
        family_header(lines, "target_info", Kind.GAUGE, "Target metadata", openmetrics)
        lines.extend(f"target_info{{{labels}}} 1" for labels in targets)
    self_family_lines(lines, own, openmetrics)
    if openmetrics:
        lines.append("# EOF")
    lines.append("")
    return "\n".join(lines).encode()


def _number(family: Family, group: Group) -> float:
    members = group.members
    if not members:
        return 0.0
    if family.kind is Kind.GAUGE:
        return max(members, key=lambda s: s.time_ns).value
    return sum(s.value for s in members)


def _histograms(lines: list[str], family: Family, openmetrics: bool) -> None:
    """All series of a histogram family. Their bucket counts (usually of one shape) are summed per
    exposed series and made cumulative in a few array operations for the whole family."""
    groups, members, starts = [], [], []
    for group in family.groups.values():
        with_data = [s for s in group.members if s.counts is not None]
        if with_data:
            starts.append(len(members))
            groups.append(group)
            members.extend(with_data)
    if not groups:
        return
    shapes = {g.bounds_raw for g in groups}
    if len(shapes) > 1:  # bounds differ between series: one at a time
        for group, start, end in zip(groups, starts, starts[1:] + [len(members)]):
            _emit(lines, family, [group], members[start:end], [0], openmetrics)
        return
    _emit(lines, family, groups, members, starts, openmetrics)


def _emit(lines, family: Family, groups: list[Group], members: list, starts: list[int], openmetrics: bool) -> None:
    """`groups` share one bucket layout; group i sums members[starts[i]:starts[i+1]]."""
    counts = np.frombuffer(b"".join(s.counts for s in members), "<u8").reshape(len(members), -1)
    if len(members) != len(groups):
        counts = np.add.reduceat(counts, starts, axis=0)
    cum = np.cumsum(counts, axis=1)
    caches = []
    for group in groups:
        if group.cache is None:
            group.cache = histogram_prefixes(family, group)
        caches.append(group.cache)
    pos = caches[0][1]
    table = np.concatenate([cum[:, pos], cum[:, -1:]], axis=1).tolist()
    ends = starts[1:] + [len(members)]
    for group, (prefixes, _, exposed_bounds, p_sum, p_count), row, start, end in zip(
            groups, caches, table, starts, ends):
        own = members[start:end]
        values = list(map(str, row))
        if openmetrics and any(s.exemplars for s in own):
            values = list(map(operator.add, values, _exemplars(own, exposed_bounds)))
        lines.extend(map(operator.add, prefixes, values))
        lines.append(p_sum + format_value(sum(s.sum for s in own)))
        lines.append(p_count + str(row[-1]))


def histogram_prefixes(family: Family, group: Group):
    bounds = group.bounds
    wanted = np.asarray(family.buckets if family.buckets is not None else bounds, np.float64)
    pos = np.searchsorted(bounds, wanted)
    if len(pos) and (pos.max(initial=0) >= len(bounds) or not np.array_equal(bounds[pos], wanted)):
        wanted, pos = bounds, np.arange(len(bounds))  # not a subset: expose the input's own bounds
    sep = "," if group.labels else ""
    name, labels = family.name, group.labels
    prefixes = [f'{name}_bucket{{{labels}{sep}le="{format_value(b)}"}} ' for b in wanted.tolist()]
    prefixes.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} ')
    return prefixes, pos, wanted.tolist(), f"{name}_sum{{{labels}}} ", f"{name}_count{{{labels}}} "


def latest_exemplars(members, exposed_bounds: list[float]) -> list[tuple | None]:
    """Per exposed bucket (values in (bounds[j-1], bounds[j]]; the last is +Inf), the latest
    exemplar of any member that falls in it: (trace_id, span_id, value, time_ns), or None."""
    latest: list[tuple | None] = [None] * (len(exposed_bounds) + 1)
    for s in members:
        for e in s.exemplars or ():
            trace_id, span_id = e.trace_id, e.span_id
            if len(trace_id) != 16 or len(span_id) != 8:
                continue
            value, when = e.as_double or e.as_int, e.time_unix_nano
            bucket = bisect.bisect_left(exposed_bounds, value)
            if latest[bucket] is None or when > latest[bucket][3]:
                latest[bucket] = (trace_id, span_id, value, when)
    return latest


def _exemplars(members, exposed_bounds: list[float]) -> list[str]:
    """OpenMetrics exemplar suffixes per exposed bucket ('' where none)."""
    return ["" if ex is None else f' # {{trace_id="{ex[0].hex()}",span_id="{ex[1].hex()}"}} '
                                  f"{format_value(ex[2])} {ex[3] / 1e9:.3f}"
            for ex in latest_exemplars(members, exposed_bounds)]
