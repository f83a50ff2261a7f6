"""Prometheus families declared through prometheus_client's API, rendered by otel_llm.

vLLM builds its `/metrics` families in `PrometheusStatLogger.__init__` through
three class attributes (`_gauge_cls`, `_counter_cls`, `_histogram_cls`), the
seam its own Ray wrappers use. `shim_classes(families)` returns three classes
with prometheus_client's constructor, `labels()`, `inc`/`set`/`observe`
surface that only record into a `FamilySet`: running vLLM's own `__init__`
on them declares exactly the families, help texts, label names, pre-created
children and buckets vLLM would serve for that configuration, and nothing is
registered with prometheus_client.

`FamilySet.render()` writes them in prometheus_client's text format 0.0.4,
byte for byte as `generate_latest` would (`_total`/`_created` series, label
names sorted, Go float formatting), with each line's prefix built once and
cached: a render only formats numbers. A family's values come from its
children, or from a `source` the owner installs (e.g. aggregated numpy
state). `FamilySet.collect()` yields the same data as prometheus_client
`Metric`s, so the set can also be registered as a collector (OpenMetrics,
multiprocess, any other reader).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"


def go_float(v: float) -> str:
    """prometheus_client's `floatToGoString`, with its common case (0 <= v < 1e6) inlined."""
    v = float(v)
    return repr(v) if 0.0 <= v < 1e6 else floatToGoString(v)


def go_count(n: int) -> str:
    """`go_float` of a bucket count: an int below 1e6 written as `17.0` without making a float of it."""
    return f"{n}.0" if type(n) is int and 0 <= n < 1000000 else go_float(n)


_INT = {int}
_COUNT_LINE = "{}{}.0\n".format  # a bucket line of an int count, as go_count writes it


def _escape(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _labels(pairs) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(pairs)) + "}"


class Child:
    """One labelled series: a value (counter, gauge) or bucket counts and a sum (histogram)."""

    __slots__ = ("family", "labelvalues", "created", "value", "counts", "sum")

    def __init__(self, family: "DeclaredFamily", labelvalues: tuple[str, ...]):
        self.family = family
        self.labelvalues = labelvalues
        self.created = time.time()
        self.value = 0.0
        if family.kind == HISTOGRAM:
            self.counts = [0] * (len(family.buckets) + 1)
            self.sum = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = float(value)

    def set_to_current_time(self) -> None:
        self.value = time.time()

    def observe(self, value: float, exemplar=None) -> None:
        self.counts[bisect_left(self.family.buckets, value)] += 1
        self.sum += value

    def histogram(self) -> tuple[list[float], float]:
        """(cumulative counts per bucket incl. +Inf, sum)."""
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out, self.sum


# A source gives a child's value(s) instead of the child itself: a float (counter, gauge) or
# (cumulative counts per bucket incl. +Inf, sum) for a histogram. Called once per child per render.
Source = Callable[[Child], object]


class DeclaredFamily:
    """One family as prometheus_client would declare it (name without `_total` for counters)."""

    def __init__(self, owner: "FamilySet", kind: str, name: str, documentation: str, labelnames=(),
                 buckets=None):
        if kind == COUNTER and name.endswith("_total"):
            name = name[:-6]  # as prometheus_client does
        self.owner, self.kind, self.name, self.documentation = owner, kind, name, documentation
        self.labelnames = tuple(labelnames)
        if kind == HISTOGRAM:
            b = [float(x) for x in (buckets or ())]
            if b and b[-1] == math.inf:
                b.pop()
            self.buckets = tuple(b)
        else:
            self.buckets = ()
        self.children: dict[tuple[str, ...], Child] = {}
        self.source: Source | None = None
        self._lines: tuple | None = None  # cached prefixes, rebuilt when children change
        if not self.labelnames:
            self.labels()  # an unlabelled family has its one child from the start
        owner.add(self)

    def labels(self, *values, **kw) -> Child:
        if kw:
            values = tuple(kw[n] for n in self.labelnames)
        key = tuple(str(v) for v in values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = Child(self, key)
            self._lines = None
        return child

    # An unlabelled family is used directly as its child.
    def inc(self, amount: float = 1) -> None:
        self.labels().inc(amount)

    def set(self, value: float) -> None:
        self.labels().set(value)

    def observe(self, value: float, exemplar=None) -> None:
        self.labels().observe(value)

    def label_dict(self, child: Child) -> dict[str, str]:
        return dict(zip(self.labelnames, child.labelvalues))

    def _prefixes(self) -> tuple:
        """Per child: (child, [prefix per sample line], its created line: the child's creation time never
        changes)."""
        if self._lines is None:
            out = []
            for child in list(self.children.values()):
                pairs = list(zip(self.labelnames, child.labelvalues))
                if self.kind == HISTOGRAM:
                    les = [go_float(b) for b in self.buckets] + ["+Inf"]
                    pre = [f"{self.name}_bucket{_labels(pairs + [('le', le)])} " for le in les]
                    pre += [f"{self.name}_count{_labels(pairs)} ", f"{self.name}_sum{_labels(pairs)} "]
                else:
                    pre = [f"{self.name}{'_total' if self.kind == COUNTER else ''}{_labels(pairs)} "]
                out.append((child, pre, f"{self.name}_created{_labels(pairs)} {go_float(child.created)}\n"))
            doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
            main = self.name + ("_total" if self.kind == COUNTER else "")
            head = f"# HELP {main} {doc}\n# TYPE {main} {self.kind}\n"
            created = f"# HELP {self.name}_created {doc}\n# TYPE {self.name}_created gauge\n"
            self._lines = (out, head, created)
        return self._lines

    def values(self, child: Child):
        if self.source is not None:
            return self.source(child)
        return child.histogram() if self.kind == HISTOGRAM else child.value

    def render(self, parts: list[str], with_created: bool) -> None:
        lines, head, created_head = self._prefixes()
        parts.append(head)
        for child, pre, _ in lines:
            v = self.values(child)
            if self.kind == HISTOGRAM:
                cum, total = v
                if set(map(type, cum)) == _INT and 0 <= min(cum) and max(cum) < 1000000:  # (go_count's common case)
                    parts.extend(map(_COUNT_LINE, pre, cum))
                else:
                    parts.extend(f"{p}{go_count(c)}\n" for p, c in zip(pre, cum))
                parts.append(pre[-2] + go_count(cum[-1]) + "\n")
                parts.append(pre[-1] + go_float(total) + "\n")
            else:
                parts.append(pre[0] + go_float(v) + "\n")
        if with_created and self.kind != GAUGE and lines:
            parts.append(created_head)
            parts.extend(c for _, _, c in lines)

    def metric(self, with_created: bool) -> Metric:
        """The same data as a prometheus_client `Metric` (for registries and other exposition formats)."""
        m = Metric(self.name, self.documentation, self.kind)
        for child in list(self.children.values()):
            labels = self.label_dict(child)
            v = self.values(child)
            if self.kind == HISTOGRAM:
                cum, total = v
                for b, c in zip([go_float(b) for b in self.buckets] + ["+Inf"], cum):
                    m.add_sample(self.name + "_bucket", {**labels, "le": b}, c)
                m.add_sample(self.name + "_count", labels, cum[-1])
                m.add_sample(self.name + "_sum", labels, total)
            else:
                m.add_sample(self.name + ("_total" if self.kind == COUNTER else ""), labels, v)
            if with_created and self.kind != GAUGE:
                m.add_sample(self.name + "_created", labels, child.created)
        return m


class FamilySet:
    """An ordered set of families (a later declaration of a name replaces the earlier one)."""

    def __init__(self, with_created: bool | None = None):
        if with_created is None:
            from prometheus_client import metrics
            with_created = bool(getattr(metrics, "_use_created", True))
        self.with_created = with_created
        self.families: dict[str, DeclaredFamily] = {}

    def add(self, family: DeclaredFamily) -> None:
        self.families.pop(family.name, None)
        self.families[family.name] = family

    def render(self) -> bytes:
        parts: list[str] = []
        for fam in list(self.families.values()):
            fam.render(parts, self.with_created)
        return "".join(parts).encode()

    def collect(self):
        for fam in list(self.families.values()):
            yield fam.metric(self.with_created)


def shim_classes(families: FamilySet) -> tuple[type, type, type]:
    """(Counter, Gauge, Histogram) stand-ins that declare into `families` (constructor keywords as
    prometheus_client's; `registry`, `multiprocess_mode`, namespace and the like are ignored)."""

    def make(kind: str) -> type:
        def __new__(cls, name: str, documentation: str = "", labelnames=(), namespace: str = "",
                    subsystem: str = "", unit: str = "", registry=None, _labelvalues=None, buckets=None,
                    **_ignored):
            full = "_".join(p for p in (namespace, subsystem, name) if p)
            return DeclaredFamily(families, kind, full, documentation, labelnames, buckets)

        return type(kind.capitalize(), (), {"__new__": __new__})

    return make(COUNTER), make(GAUGE), make(HISTOGRAM)
