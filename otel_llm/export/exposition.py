"""Prometheus exposition: text format 0.0.4 and OpenMetrics 1.0, straight from snapshots.

Rendering does not go through prometheus_client (50-75 ms for a vLLM-scale
payload here): every sample line's prefix (name, labels, `le`) is built once
per series and cached, so a render only formats numbers. OpenMetrics output
carries exemplars (trace_id/span_id of the latest sampled request) on
histogram buckets.

A `Source` is one Telemetry's immutable snapshot plus its base labels; several
sources (e.g. data-parallel engines) render into one exposition, each family
once. A component's own telemetry (`SelfFamily`: exporter counts, the
collector's receivers) is appended after them.

Bounded (`cardinality.py`): a renderer gives its own series to the first `cardinality_limit`
base label sets (model, engine, version) it sees; sources beyond fold into one source whose
series carry only `otel_metric_overflow="true"` (and a family's fixed `const` labels). LoRA
families take their adapter series from `Source.lora`, each bounded the same way.

Size: text 0.0.4 and OpenMetrics share every line writer and the cardinality folding; split by
format, each would copy them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from otel_llm.canonical.cardinality import (
    DEFAULT_CARDINALITY_LIMIT, OVERFLOW, OVERFLOW_FAMILY, OVERFLOW_HELP, OVERFLOW_LABEL, CardinalityLimiter, fold,
)
from otel_llm.canonical.instruments import (ADAPTER_ATTRIBUTE, DECLARED_AT_ZERO, DIMENSIONS, LORA_INFO, LORA_REQUESTS,
                                           SLEEP_STATE, Instrument, Kind)
from otel_llm.canonical.metrics_state import HistogramSnapshot, MetricsSnapshot
from otel_llm.export.render_plan import RenderPlan
from otel_llm.export.prom_families import go_float
from otel_llm.frontend.lora import INFO_LABELS, LoraSnapshot, fold_lora, merge_info
from otel_llm.shim.profile import Profile, ProfileFamily
from otel_llm.shim.prometheus_naming import label_name

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass(frozen=True)
class Source:
    snapshot: MetricsSnapshot
    table: dict[str, Instrument]
    model: str
    engine: str
    cache_config: tuple[tuple[str, str], ...] = ()
    version: str = "1"  # the model version (Triton's `version` label)
    lora: LoraSnapshot | None = None
    overflow: bool = False  # the sources beyond a renderer's cardinality limit, folded (`cardinality.fold`)
    stage: str = ""  # vLLM-Omni pipeline stage and replica: the base labels of a `Profile.stage_replica` profile
    replica: str = ""


class SelfFamily(NamedTuple):
    """A family of a component's own telemetry: samples are (label text, value)."""

    name: str
    kind: Kind
    help: str
    samples: tuple[tuple[str, float], ...]


def escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str, openmetrics: bool) -> str:
    """A HELP text as each format writes it: text format 0.0.4 escapes only backslash and newline
    (a `\\"` there is an invalid escape, and promtool rejects the whole exposition); OpenMetrics
    1.0 escapes double quotes too, as in label values."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if openmetrics else text


format_value = go_float  # as prometheus_client writes numbers (Go's formatting: `1e+06`, `+Inf`)


def label_text(pairs) -> str:
    return ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)


def series_groups(inst: Instrument, fam: ProfileFamily) -> list[tuple[tuple[tuple[str, str], ...], np.ndarray]]:
    """Series of `inst` grouped by the labels `fam` keeps: [(label pairs, series indices)]."""
    vocab = [DIMENSIONS[d] for d in inst.dims]
    groups: dict[tuple, list[int]] = {}
    for series in range(inst.num_series):
        values = np.unravel_index(series, [len(v) for v in vocab]) if vocab else ()
        if any(d in fam.only and vv[i] not in fam.only[d] for d, vv, i in zip(inst.dims, vocab, values)):
            continue
        pairs = []
        for d, vv, i in zip(inst.dims, vocab, values):
            if d in fam.labels:
                label, vmap = fam.labels[d]
                mapped = vmap(vv[i])
                if mapped is not None:
                    pairs.append((label, mapped))
        groups.setdefault(tuple(pairs), []).append(series)
    return [(k, np.array(v)) for k, v in groups.items()]


class _SourcePlan(NamedTuple):
    prepared: list  # per profile family: `Renderer._prepared`'s (entries, ends), None where not shown so
    values: RenderPlan
    starts: list  # per profile family: where its entries' values begin (cumulative counts, sums, counters)


class Renderer:
    """Renders sources under one profile; caches line prefixes. Not thread-safe: one per thread or lock."""

    def __init__(self, profile: Profile, cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT):
        self.profile = profile
        self._cache: dict = {}  # a folded source's prepared entries per family
        self.limit = cardinality_limit
        self._bases = CardinalityLimiter(cardinality_limit)  # (model, engine, version) of the sources
        self._overflowed: dict[str, int] = {}  # canonical instrument -> measurements folded here
        self._shown = {f.canonical for f in profile.families}
        self._plans: dict[tuple, _SourcePlan] = {}  # per source (not a folded one: its table is new each render)

    def _prepared(self, src: Source, fam: ProfileFamily, inst: Instrument):
        # a folded source's, kept here (its table is new each render); another's are kept in its plan
        key = (OVERFLOW_LABEL, fam.name, fam.const, inst.buckets, inst.export_buckets) if src.overflow else None
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        base_labels = self.profile.base_labels if fam.base is None else fam.base
        base = tuple((label, getattr(src, field)) for label, field in base_labels) + fam.const
        if inst.name == "otel_llm.cache_config.info" and not fam.cache_key:
            base = src.cache_config + ((("stage", src.stage), ("replica", src.replica)) if self.profile.stage_replica
                                       else ((self.profile.engine_label, src.engine),))
        out = []
        fine = np.asarray(inst.buckets, np.float64)
        coarse = np.asarray(fam.canonical_buckets or inst.otlp_buckets, np.float64)
        shown = fam.buckets or inst.otlp_buckets  # `le` as the family writes it
        groups = series_groups(inst, fam)
        if src.overflow:  # one series, on the bounds every folded source has
            base = (OVERFLOW_LABEL,) + fam.const
            keep = np.isin(coarse, fine)
            coarse, shown = coarse[keep], tuple(b for b, k in zip(shown, keep.tolist()) if k)
            groups = [((), np.concatenate([g for _, g in groups]))] if groups else []
        pos = np.searchsorted(fine, coarse)  # coarse bounds are a subset of the fine ones
        if inst.kind is Kind.HISTOGRAM and not fam.part and not np.array_equal(fine[pos[pos < len(fine)]], coarse):
            raise ValueError(f"{fam.name}: buckets {coarse.tolist()} are not a subset of {fine.tolist()}")
        for pairs, series in groups:
            # one series: plain indexing; all of them: a slice (neither copies)
            series = int(series[0]) if len(series) == 1 else slice(None) if len(series) == inst.num_series else series
            lab = label_text(base + pairs)
            if inst.kind is Kind.HISTOGRAM and not fam.part:
                sep = "," if lab else ""
                prefixes = [f'{fam.name}_bucket{{{lab}{sep}le="{format_value(b)}"}} ' for b in shown]
                prefixes.append(f'{fam.name}_bucket{{{lab}{sep}le="+Inf"}} ')
                braced = f"{{{lab}}}" if lab else ""
                p_sum, p_count = f"{fam.name}_sum{braced} ", f"{fam.name}_count{braced} "
                template = "\n".join(p.replace("%", "%%") + "%d" for p in prefixes) + (  # all its lines at once
                    f"\n{p_sum.replace('%', '%%')}%s\n{p_count.replace('%', '%%')}%d")
                out.append((series, prefixes, p_sum, p_count, template))
            else:
                suffix = self.profile.counter_suffix if fam.kind(inst) is Kind.COUNTER else ""
                out.append((series, f"{fam.name}{suffix}{{{lab}}} " if lab else f"{fam.name}{suffix} "))
        prepared = (out, np.append(pos, len(fine)))  # each shown bucket's last fine one, then +Inf's
        if key is not None:
            self._cache[key] = prepared
        return prepared

    def _plan(self, src: Source) -> _SourcePlan:
        """`src`'s prepared entries per profile family, the `RenderPlan` of its values and where each
        family's start in them. Cached per source (a folded source's entries only per family: its table
        is new each render)."""
        key = None if src.overflow else (src.model, src.engine, src.stage, src.replica, id(src.table))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        prepared, histograms, counters, starts = [], [], [], []
        values = 0  # the histogram entries' cumulative counts so far
        for fam in self.profile.families:
            inst = src.table.get(fam.canonical)
            if inst is None or inst.name in (LORA_INFO, LORA_REQUESTS):
                prepared.append(None)
                starts.append(None)
                continue
            prepared.append(self._prepared(src, fam, inst))
            out, ends = prepared[-1]
            starts.append((values, len(histograms), len(counters)))
            if inst.kind is Kind.HISTOGRAM and not fam.part:
                nb = len(inst.buckets) + 1
                histograms.extend((inst.name, inst.num_series, nb, entry[0], ends) for entry in out)
                values += len(out) * len(ends)
            elif inst.kind is Kind.COUNTER:
                counters.extend((inst.name, inst.num_series, entry[0]) for entry in out)
        plan = _SourcePlan(prepared, RenderPlan(histograms, counters), starts)
        if key is not None:
            self._plans[key] = plan
        return plan

    def render(self, sources: list[Source], openmetrics: bool = False, own: tuple[SelfFamily, ...] = ()) -> bytes:
        openmetrics = openmetrics and self.profile.openmetrics
        sources, folded = self._bounded(sources)
        sources = self._merged(sources)
        plans = [self._plan(s) for s in sources]
        numbers = [plan.values.numbers(s.snapshot) for s, plan in zip(sources, plans)]
        lines: list[str] = []
        header = None  # consecutive entries with one name (differing in `const`) are one family
        counted = set()
        for f, fam in enumerate(self.profile.families):
            members = [(s, s.table[fam.canonical], plan.prepared[f], plan.starts[f], n)
                       for s, plan, n in zip(sources, plans, numbers) if fam.canonical in s.table]
            if not members:
                continue
            inst = members[0][1]
            if inst.name in (LORA_INFO, LORA_REQUESTS):
                self._lora(lines, fam, inst, [m[0] for m in members], openmetrics)
                continue
            if folded and fam.canonical not in counted and members[-1][0].overflow:
                counted.add(fam.canonical)  # each folded source's observation of it, once per render
                self._overflowed[fam.canonical] = self._overflowed.get(fam.canonical, 0) + folded
            if inst.name == "otel_llm.cache_config.info" and not any(m[0].cache_config for m in members):
                continue
            if inst.name == SLEEP_STATE and all(m[0].snapshot.gauges.get(SLEEP_STATE) is None for m in members):
                continue  # a source without a sleep mode (only vLLM's plugin sets it)
            if fam.name != header:
                header = fam.name
                family_header(lines, fam.name, fam.kind(inst), inst.description if fam.help is None else fam.help,
                              openmetrics, self.profile.counter_suffix)
            scale = fam.scale
            merged: dict[str, float] = {}  # a `base` family's series, summed over sources it does not tell apart
            for src, inst, (prepared, ends), start, (cumulative, sums, counters) in members:
                empty = self.profile.emit_empty or not inst.dims or inst.name in DECLARED_AT_ZERO
                if fam.part:
                    h = src.snapshot.histograms[inst.name]
                    values = _totals(h.sums if fam.part == "sum" else h.counts.sum(axis=1), prepared)
                    seen = _totals(h.counts.sum(axis=1), prepared) if fam.part == "sum" else values
                    lines.extend(p + format_value(v * scale) for (_, p), v, n in zip(prepared, values, seen)
                                 if empty or n)
                elif inst.kind is Kind.HISTOGRAM:
                    self._histogram(lines, src.snapshot.histograms, inst.name, prepared, ends, openmetrics, empty,
                                    scale, cumulative, sums, start)
                elif inst.kind is Kind.COUNTER and fam.base is not None:
                    for (_, p), v in zip(prepared, counters[start[2]:]):
                        if empty or v:  # (counters never go below 0: a sum of 0 has no count in it)
                            merged[p] = merged.get(p, 0.0) + v * scale
                elif inst.kind is Kind.COUNTER:
                    lines.extend(p + format_value(v * scale) for (_, p), v in zip(prepared, counters[start[2]:])
                                 if empty or v)
                elif inst.dims:  # a value per series (0 until set, as an unset gauge without dims)
                    values = src.snapshot.gauges.get(inst.name)
                    totals = [0.0] * len(prepared) if values is None else _totals(values, prepared)
                    lines.extend(p + format_value(v * scale) for (_, p), v in zip(prepared, totals))
                else:
                    v = (cache_value(dict(src.cache_config), fam.cache_key) if fam.cache_key
                         else src.snapshot.gauges.get(inst.name) or 0.0)
                    if v is not None:
                        lines.extend(p + format_value(v * scale) for _, p in prepared)
            lines.extend(p + format_value(v) for p, v in merged.items())
        self_family_lines(lines, (*self._overflow_family(sources), *own), openmetrics)
        if openmetrics:
            lines.append("# EOF")
        lines.append("")
        return "\n".join(lines).encode()

    def _merged(self, sources: list[Source]) -> list[Source]:
        """Sources the profile's base labels do not tell apart (engines of a server whose names have
        no engine label: SGLang, TGI, Triton) as one, so no series is written twice."""
        fields = tuple(f for _, f in self.profile.base_labels)
        groups: dict[tuple, list[Source]] = {}
        for s in sources:
            groups.setdefault((s.overflow,) + tuple(getattr(s, f) for f in fields), []).append(s)
        if len(groups) == len(sources):
            return sources
        out = []
        for group in groups.values():
            if len(group) == 1:
                out.append(group[0])
                continue
            snapshot, table = fold([s.snapshot for s in group], [s.table for s in group], sum_gauges=True)
            first = group[0]
            out.append(replace(first, snapshot=snapshot, table=table, engine=",".join(s.engine for s in group),
                               lora=fold_lora([s.lora for s in group if s.lora])))
        return out

    def _bounded(self, sources: list[Source]) -> tuple[list[Source], int]:
        """The sources with series of their own, then the rest folded into one; (sources, how many folded)."""
        beyond = [self._bases.slot((s.model, s.engine, s.version, s.stage, s.replica), 0) == OVERFLOW
                  for s in sources]
        if not any(beyond):
            return sources, 0
        over = [s for s, b in zip(sources, beyond) if b]
        snapshot, table = fold([s.snapshot for s in over], [s.table for s in over])
        cache_config = next((s.cache_config for s in reversed(over) if s.cache_config), ())
        folded = Source(snapshot, table, "", "", cache_config, "", fold_lora([s.lora for s in over if s.lora]), True)
        return [s for s, b in zip(sources, beyond) if not b] + [folded], len(over)

    def _lora(self, lines: list[str], fam: ProfileFamily, inst: Instrument, sources: list[Source], openmetrics: bool) -> None:
        """`vllm:lora_requests_info` (no model label: merged across sources) or the per-adapter counter."""
        snaps = [s.lora for s in sources if s.lora is not None]
        if inst.name == LORA_INFO:
            if not any(s.max_loras for s in snaps):
                return  # as vLLM without a LoRA config
            series, overflow, n = merge_info(snaps, self.limit)
            self._overflowed[LORA_INFO] = self._overflowed.get(LORA_INFO, 0) + n
            family_header(lines, fam.name, Kind.GAUGE, inst.description if fam.help is None else fam.help, openmetrics)
            lines.extend(f"{fam.name}{{{label_text(zip(INFO_LABELS, key))}}} {format_value(v)}" for key, v in series)
            if overflow is not None:
                lines.append(f"{fam.name}{{{label_text((OVERFLOW_LABEL,))}}} {format_value(overflow)}")
            return
        adapter = label_name(ADAPTER_ATTRIBUTE)
        name = fam.name + self.profile.counter_suffix
        rows, overflow = [], sum(s.requests_overflow for s in snaps)
        for src in sources:
            if src.lora is not None and not src.overflow:
                base = tuple((label, getattr(src, field)) for label, field in self.profile.base_labels)
                rows.extend((label_text(base + ((adapter, a),)), c) for a, c in src.lora.requests)
        if not rows and not overflow:
            return
        family_header(lines, fam.name, Kind.COUNTER, inst.description if fam.help is None else fam.help, openmetrics,
                      self.profile.counter_suffix)
        lines.extend(f"{name}{{{lab}}} {format_value(c)}" for lab, c in rows)
        if overflow:
            lines.append(f"{name}{{{label_text((OVERFLOW_LABEL,))}}} {format_value(overflow)}")

    def _overflow_family(self, sources: list[Source]) -> tuple[SelfFamily, ...]:
        """`otel_llm_metric_overflow_measurements_total{metric}`, once something overflowed."""
        counts = dict(self._overflowed)
        for s in sources:
            if s.lora is not None:
                for k, v in s.lora.overflowed.items():
                    counts[k] = counts.get(k, 0) + v
        samples = tuple((label_text((("metric", k),)), float(v)) for k, v in sorted(counts.items())
                        if v and k in self._shown)
        return (SelfFamily(OVERFLOW_FAMILY, Kind.COUNTER, OVERFLOW_HELP, samples),) if samples else ()

    @staticmethod
    def _histogram(lines: list[str], histograms: Mapping[str, HistogramSnapshot], name: str, prepared,
                   ends: np.ndarray, openmetrics: bool,
                   empty: bool, scale: float, cumulative: list[int], sums: list[float], start: tuple[int, int, int]
                   ) -> None:
        """`cumulative`, `sums`: the source's (`RenderPlan.numbers`), this family's entries' from `start`
        on: per entry, its cumulative counts at the shown bounds (`ends`: the fine bucket each ends at)
        and its sum."""
        at, first, _ = start
        k = len(ends)
        h = histograms[name] if openmetrics else None  # (text: read from the plan's numbers alone)
        exemplars = h is not None and h.exemplars is not None
        for e, (series, prefixes, p_sum, p_count, template) in enumerate(prepared):
            values = cumulative[at + e * k:at + (e + 1) * k]
            total = values[-1]
            if not empty and not total:
                continue
            total_sum = format_value(sums[first + e] * scale)
            if not exemplars:
                lines.append(template % (*values, total_sum, total))  # the buckets, sum and count lines
                continue
            ex = _exemplars(h, np.arange(len(h.counts))[series] if type(series) is slice else np.atleast_1d(series),
                            ends, scale)
            lines.extend(p + str(v) + e for p, v, e in zip(prefixes, values, ex))
            lines.append(p_sum + total_sum)
            lines.append(p_count + str(total))


def _totals(values: np.ndarray, prepared) -> list[float]:
    """Each prepared entry's value from a per-series array: one series' read off a list (no numpy call
    per series), a group's summed."""
    listed = values.tolist()
    return [listed[series] if type(series) is int else float(values[series].sum()) for series, *_ in prepared]


def family_header(lines: list[str], name: str, kind: Kind, help_text: str, openmetrics: bool,
                  counter_suffix: str = "_total") -> None:
    """HELP and TYPE of a family (a counter's name takes `_total` in text format 0.0.4)."""
    fname = name if (openmetrics or kind is not Kind.COUNTER) else name + counter_suffix
    if help_text:
        lines.append(f"# HELP {fname} {escape_help(help_text, openmetrics)}")
    lines.append(f"# TYPE {fname} {kind.value}")


def cache_value(entries: Mapping[str, str], keys: tuple[str, ...]) -> float | None:
    """The product of `keys`' cache-config entries; None when one is missing or not a number (the
    series is then left out)."""
    value = 1.0
    for k in keys:
        try:
            value *= float(entries[k])
        except (KeyError, ValueError):
            return None
    return value


def self_family_lines(lines: list[str], families, openmetrics: bool) -> None:
    for fam in families:
        family_header(lines, fam.name, fam.kind, fam.help, openmetrics)
        sample = fam.name + ("_total" if fam.kind is Kind.COUNTER else "")
        lines.extend(f"{sample}{{{labels}}} {format_value(v)}" if labels else f"{sample} {format_value(v)}"
                     for labels, v in fam.samples)


def _exemplars(h: HistogramSnapshot, series: np.ndarray, ends: np.ndarray, scale: float) -> list[str]:
    """Per coarse bucket (fine buckets up to each of `ends`), the latest exemplar among its fine buckets
    and `series` (OpenMetrics suffix, or ''); of equally recent ones, the first series' first bucket."""
    trace, value, when = h.exemplars
    nb = h.counts.shape[1]
    w = when.reshape(-1, nb)[series]  # [series, fine bucket]
    latest = w.max(axis=0)
    first_row = (w == latest).argmax(axis=0).tolist()  # per fine bucket, the first series that has it
    latest = latest.tolist()
    rows = series.tolist()
    out = []
    lo = 0
    for hi in ends.tolist():
        t = max(latest[lo:hi + 1])
        if t <= 0:
            out.append("")
        else:
            row, b = min((first_row[b], b) for b in range(lo, hi + 1) if latest[b] == t)
            best = rows[row] * nb + b
            hi_, lo_, span = (int(x) for x in trace[best][:3])
            out.append(f' # {{trace_id="{(hi_ << 64 | lo_):032x}",span_id="{span:016x}"}} '
                       f"{format_value(value[best] * scale)} {t / 1e9:.3f}")
        lo = hi + 1
    return out


def negotiate(accept: str | None) -> bool:
    """True when the client asks for OpenMetrics (as Prometheus does when it can take it)."""
    return bool(accept) and "application/openmetrics-text" in accept
