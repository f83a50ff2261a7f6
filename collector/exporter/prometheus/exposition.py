"""The collector's Prometheus exposition: text 0.0.4 and OpenMetrics 1.0 from the store.

Written like the server's renderer (`otel_llm.export.exposition`): each exposed series
caches its line prefixes (name, labels, `le`), so a render formats numbers
only. Histograms are re-bucketed to the profile's bounds when the input's
bounds contain them (exact, as on the server); otherwise the input's bounds are
exposed (OTLP carries the canonical bounds: most SGLang and TGI families, and
Triton's first-response histogram, are shown on those). Values are scaled to the
family's unit (Triton's us and ms), a `part` family shows its histograms' sum or
count. OpenMetrics carries, per bucket, the latest exemplar (trace_id, span_id)
of any input series summed into it; profiles of text-only servers are always
text 0.0.4 (`Profile.openmetrics`). The caller holds `store.lock`.
"""

from __future__ import annotations

import bisect
import operator
from decimal import Decimal

import numpy as np

from otel_llm.canonical.instruments import Kind
from otel_llm.collector.exporter.prometheus.metric_store import Group, MetricStore, StoreFamily
from otel_llm.export.exposition import SelfFamily, family_header, format_value, label_text, self_family_lines


def render(store: MetricStore, openmetrics: bool = False, own: tuple[SelfFamily, ...] = ()) -> bytes:
    openmetrics = openmetrics and store.router.profile.openmetrics
    lines: list[str] = []
    for family in store.families.values():
        family_header(lines, family.name, family.kind, family.help, openmetrics, family.suffix)
        if family.kind is Kind.HISTOGRAM:
            _histograms(lines, family, openmetrics)
        else:
            sample = family.name + (family.suffix if family.kind is Kind.COUNTER else "")
            for group in family.groups.values():
                if not group.shown:
                    continue
                prefix = group.cache
                if prefix is None:
                    prefix = group.cache = f"{sample}{{{group.labels}}} " if group.labels else f"{sample} "
                lines.append(prefix + format_value(number(family, group)))
    targets = [label_text(r.target_pairs) for r in store.resources.values() if r.num_series > 0]
    if targets:
        family_header(lines, "target_info", Kind.GAUGE, "Target metadata", openmetrics)
        lines.extend(f"target_info{{{labels}}} 1" for labels in targets)
    self_family_lines(lines, own, openmetrics)
    if openmetrics:
        lines.append("# EOF")
    lines.append("")
    return "\n".join(lines).encode()


def number(family: StoreFamily, group: Group) -> float:
    """A counter's or gauge's exposed value: its members summed (a gauge: the newest), in the family's unit."""
    members = group.members
    if not members:
        return 0.0
    if family.kind is Kind.GAUGE:
        latest = max(members, key=lambda s: s.time_ns)
        return latest.value * latest.factor * family.scale
    if family.part == "sum":
        return sum(s.sum for s in members) * family.scale
    if family.part == "count":
        return float(sum(s.count for s in members))
    return sum(s.value for s in members) * family.scale


def _histograms(lines: list[str], family: StoreFamily, openmetrics: bool) -> None:
    """All series of a histogram family. Their bucket counts (usually of one shape) are summed per
    exposed series and made cumulative in a few array operations for the whole family."""
    groups, members, starts = [], [], []
    for group in family.groups.values():
        with_data = [s for s in group.members if s.counts is not None]
        if with_data and group.shown:
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


def _emit(lines, family: StoreFamily, groups: list[Group], members: list, starts: list[int], openmetrics: bool) -> None:
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
    for group, (prefixes, _, exposed_bounds, _, p_sum, p_count), row, start, end in zip(
            groups, caches, table, starts, ends):
        own = members[start:end]
        values = list(map(str, row))
        if openmetrics and any(s.exemplars for s in own):
            values = list(map(operator.add, values, _exemplars(own, exposed_bounds, family.scale)))
        lines.extend(map(operator.add, prefixes, values))
        lines.append(p_sum + format_value(sum(s.sum for s in own) * family.scale))
        lines.append(p_count + str(row[-1]))


def histogram_prefixes(family: StoreFamily, group: Group):
    """(bucket line prefixes, positions of the exposed bounds among the input's, the exposed bounds in the
    input's unit, the `le` texts, _sum prefix, _count prefix)."""
    bounds = group.bounds
    wanted = np.asarray(family.buckets if family.buckets is not None else bounds, np.float64)
    pos = np.searchsorted(bounds, wanted)
    shown = family.shown_buckets if family.buckets is not None else None
    if len(pos) and (pos.max(initial=0) >= len(bounds) or not np.array_equal(bounds[pos], wanted)):
        wanted, pos, shown = bounds, np.arange(len(bounds)), None  # not a subset: expose the input's own bounds
    if shown is None:
        shown = scaled(wanted.tolist(), family.scale)
    les = [format_value(b) for b in shown] + ["+Inf"]
    name, labels = family.name, group.labels
    sep, braced = ("," if labels else ""), (f"{{{labels}}}" if labels else "")
    prefixes = [f'{name}_bucket{{{labels}{sep}le="{le}"}} ' for le in les]
    return prefixes, pos, wanted.tolist(), les, f"{name}_sum{braced} ", f"{name}_count{braced} "


def scaled(bounds: list[float], scale: float) -> list[float]:
    """Bounds in the family's unit, scaled as the decimals they are written as (0.07 s is 70 ms, where
    0.07 * 1000 is 70.00000000000001)."""
    if scale == 1.0:
        return bounds
    return [float(Decimal(repr(b)) * Decimal(repr(scale))) for b in bounds]


def latest_exemplars(members, exposed_bounds: list[float]) -> list[tuple | None]:
    """Per exposed bucket (values in (bounds[j-1], bounds[j]]; the last is +Inf), the latest
    exemplar of any member that falls in it: (trace_id, span_id, value, time_ns), or None."""
    latest: list[tuple | None] = [None] * (len(exposed_bounds) + 1)
    for s in members:
        for e in s.exemplars or ():
            if type(e) is not tuple:  # the wire view's Exemplar (an export the store parsed)
                e = (e.trace_id, e.span_id, e.as_double, e.as_int, e.time_unix_nano)
            trace_id, span_id, as_double, as_int, when = e
            if len(trace_id) != 16 or len(span_id) != 8:
                continue
            value = as_double or as_int
            bucket = bisect.bisect_left(exposed_bounds, value)
            if latest[bucket] is None or when > latest[bucket][3]:
                latest[bucket] = (trace_id, span_id, value, when)
    return latest


def _exemplars(members, exposed_bounds: list[float], scale: float) -> list[str]:
    """OpenMetrics exemplar suffixes per exposed bucket ('' where none), values in the family's unit."""
    return ["" if ex is None else f' # {{trace_id="{ex[0].hex()}",span_id="{ex[1].hex()}"}} '
                                  f"{format_value(ex[2] * scale)} {ex[3] / 1e9:.3f}"
            for ex in latest_exemplars(members, exposed_bounds)]
