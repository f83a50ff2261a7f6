"""The collector's in-memory metric model: OTLP points in, Prometheus series out.

Every OTLP data point belongs to an *input series* (resource, scope, metric,
attributes) holding its latest cumulative state. The shim (`metric_routes.py`)
assigns each input series to an *exposed series* (`Group`): a Prometheus family
name and label set. Input series whose labels coincide after the shim (vLLM's
families drop the operation dimension, say) are summed at exposition, as the
server's own `/metrics` sums them.

Temporality: cumulative points replace the state (a new start time means the
sender restarted: the value starts again from the new point, which Prometheus
sees as a counter reset); delta points are added (one whose start is before the
previous point's time overlaps it and is refused); gauges keep the newest value.
Points older than the state are ignored.

Limits (never unbounded memory): per resource and metric, at most
`cardinality_limit` input series get labels of their own; more go into one
overflow series labelled ``otel_metric_overflow="true"`` (as the OTel
specification's cardinality limits define), which sums up to another
`cardinality_limit` of them; beyond that, and beyond `max_series` in all, points
are refused and reported to the sender (OTLP partial success). Series not
updated for `expiry_s` are removed (`expire`).

Thread-safety: `ingest` parses outside the lock and applies under it; readers
(exposition, remote-write) hold `lock` while they read. One lock, held briefly.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from collector import otlp_metrics_wire as wire
from collector.metric_routes import OVERFLOW_LABEL, ResourceInfo, Route, Router
from collector.otlp_codec import PayloadError
from otel_llm.instruments import Kind

_MAX_REASONS = 5


@dataclass(frozen=True)
class StoreConfig:
    profile: str = "vllm"
    expiry_s: float = 300.0
    cardinality_limit: int = 2000  # input series per resource and metric before overflow
    max_series: int = 200_000

    def __post_init__(self) -> None:
        if not self.expiry_s > 0:
            raise ValueError(f"expiry_s must be > 0, got {self.expiry_s!r}")
        if not (isinstance(self.cardinality_limit, int) and self.cardinality_limit >= 1):
            raise ValueError(f"cardinality_limit must be an int >= 1, got {self.cardinality_limit!r}")
        if not (isinstance(self.max_series, int) and self.max_series >= 1):
            raise ValueError(f"max_series must be an int >= 1, got {self.max_series!r}")


class IngestResult(NamedTuple):
    accepted: int  # data points
    refused: int
    reason: str  # "" when nothing was refused; else the distinct reasons, "; "-joined


class Series:
    """One input series' latest state. Histograms: `counts` per input bucket (not cumulative)."""

    __slots__ = ("key", "group", "route", "start_ns", "time_ns", "seen_s", "value", "counts", "bounds",
                 "count", "sum", "exemplars")

    def __init__(self, key: tuple, group: Group, route: Route):
        self.key, self.group, self.route = key, group, route
        self.start_ns = self.time_ns = 0
        self.seen_s = 0.0
        self.value = 0.0
        self.counts: np.ndarray | None = None
        self.bounds: np.ndarray | None = None
        self.count = 0
        self.sum = 0.0
        self.exemplars: dict[int, tuple[str, float, int]] | None = None  # bucket -> (labels, value, time_ns)


class Group:
    """One exposed Prometheus series: a family, a label set, the input series summed into it."""

    __slots__ = ("family", "labels", "members", "bounds", "cache")

    def __init__(self, family: Family, labels: str):
        self.family, self.labels = family, labels
        self.members: list[Series] = []
        self.bounds: np.ndarray | None = None  # input bucket bounds shared by all members
        self.cache: tuple | None = None  # the exposition's line prefixes


class Family:
    """One exposed Prometheus family."""

    __slots__ = ("name", "kind", "help", "buckets", "groups", "keep_empty")

    def __init__(self, name: str, kind: Kind, help_text: str, buckets: tuple[float, ...] | None):
        self.name, self.kind, self.help, self.buckets = name, kind, help_text, buckets
        self.groups: dict[str, Group] = {}
        self.keep_empty = False  # groups pre-created with no members (vLLM's labelled children)


class MetricStore:
    def __init__(self, config: StoreConfig | None = None, clock=time.monotonic):
        self.config = config or StoreConfig()
        self.router = Router(self.config.profile)
        self.lock = threading.Lock()
        self.families: dict[str, Family] = {}
        self.resources: dict[bytes, ResourceInfo] = {}
        self._series: dict[tuple, Series] = {}
        self._per_metric: dict[tuple, list[int]] = {}  # (resource, metric) -> [own, overflowed]
        self._routes: dict[tuple, Route | None] = {}
        self._clock = clock

    # -- ingestion -----------------------------------------------------------------------

    def ingest(self, payload: bytes) -> IngestResult:
        """Apply one ExportMetricsServiceRequest (protobuf bytes). Raises PayloadError(400) if
        it does not parse; points it cannot take are refused and counted, never raised."""
        try:
            request = wire.ExportMetricsServiceRequest.FromString(payload)
        except (DecodeError, RecursionError) as exc:
            raise PayloadError(400, f"malformed protobuf ExportMetricsServiceRequest: {exc}") from None
        accepted = refused = 0
        reasons: dict[str, None] = {}
        now = self._clock()
        with self.lock:
            for rm in request.resource_metrics:
                resource_key = rm.resource
                resource = self.resources.get(resource_key)
                if resource is None:
                    try:
                        resource = self.resources[resource_key] = self.router.resource(resource_key)
                    except (DecodeError, ValueError) as exc:
                        n = _count_points(rm)
                        refused += n
                        reasons[f"bad resource: {exc}"] = None
                        continue
                resource.seen_s = now
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        ok, bad, reason = self._metric(resource, resource_key, sm.scope, metric, now)
                        accepted += ok
                        refused += bad
                        if reason and len(reasons) < _MAX_REASONS:
                            reasons[reason] = None
        return IngestResult(accepted, refused, "; ".join(reasons))

    def _metric(self, resource: ResourceInfo, resource_key: bytes, scope: bytes, metric, now: float):
        kind = metric.WhichOneof("data")
        if kind is None:
            return 0, 0, ""
        data = getattr(metric, kind)
        points = data.data_points
        if kind in ("exponential_histogram", "summary"):
            return 0, len(points), f"{metric.name}: {kind} points are not supported (use explicit buckets)"
        monotonic = kind == "sum" and data.is_monotonic
        temporality = data.aggregation_temporality if kind != "gauge" else wire.CUMULATIVE
        if temporality not in (wire.DELTA, wire.CUMULATIVE):
            return 0, len(points), f"{metric.name}: aggregation temporality unspecified"
        route_key = (scope, metric.name, kind, monotonic, metric.unit)
        route = self._routes.get(route_key, False)
        if route is False:
            try:
                route = self._routes[route_key] = self.router.route(scope, metric, kind, monotonic)
            except (DecodeError, ValueError) as exc:
                return 0, len(points), f"{metric.name}: {exc}"
        if route is None:
            return len(points), 0, ""  # a canonical instrument the profile does not expose
        delta = temporality == wire.DELTA
        ok = bad = 0
        reason = ""
        series_map = self._series
        for point in points:
            key = (resource_key, scope, metric.name, tuple(point.attributes))
            series = series_map.get(key)
            if series is None:
                series, why = self._new_series(key, resource, route, point)
                if series is None:
                    bad += 1
                    reason = why
                    continue
            why = self._apply(series, route.kind, point, delta)
            if why:
                bad += 1
                reason = f"{metric.name}: {why}"
            else:
                ok += 1
                series.seen_s = now
        return ok, bad, reason

    def _apply(self, s: Series, kind: Kind, p, delta: bool) -> str:
        """Update `s` from point `p`; returns why the point was refused, "" if taken."""
        if p.flags & wire.FLAG_NO_RECORDED_VALUE:
            return ""
        t, start = p.time_unix_nano, p.start_time_unix_nano
        if t < s.time_ns and (delta or start == s.start_ns):
            return "" if not delta else "delta point older than the last one"
        if delta and s.time_ns and start < s.time_ns:
            return "delta point overlaps the previous one"
        restart = not delta and start != s.start_ns
        if kind is Kind.HISTOGRAM:
            counts, bounds = wire.histogram_arrays(p)
            if s.group.bounds is None:
                s.group.bounds = bounds.copy()
            elif not np.array_equal(bounds, s.group.bounds):
                return "bucket bounds differ from the series' earlier ones"
            if delta and s.counts is not None:
                s.counts = s.counts + counts
                s.count += p.count
                s.sum += p.sum
            else:
                s.counts, s.count, s.sum = counts, p.count, p.sum
                if restart:
                    s.exemplars = None
            s.bounds = s.group.bounds
            if len(p.exemplars):
                self._exemplars(s, p.exemplars)
        elif delta:  # a sum (gauges are never delta)
            s.value += wire.number_value(p)
        else:
            s.value = wire.number_value(p)
        if restart or not s.start_ns:
            s.start_ns = start
        s.time_ns = t
        return ""

    @staticmethod
    def _exemplars(s: Series, exemplars) -> None:
        kept = s.exemplars if s.exemplars is not None else {}
        bounds = s.bounds
        for e in exemplars:
            if len(e.trace_id) != 16 or len(e.span_id) != 8:
                continue
            value = wire.number_value(e)
            bucket = int(np.searchsorted(bounds, value, side="left"))
            labels = f'trace_id="{e.trace_id.hex()}",span_id="{e.span_id.hex()}"'
            kept[bucket] = (labels, value, e.time_unix_nano)
        s.exemplars = kept

    def _new_series(self, key: tuple, resource: ResourceInfo, route: Route, point):
        if len(self._series) >= self.config.max_series:
            return None, f"the collector holds its limit of {self.config.max_series} series"
        counts = self._per_metric.setdefault((key[0], key[2]), [0, 0])
        limit = self.config.cardinality_limit
        if counts[0] < limit:
            try:
                labels, siblings = route.labels(wire.decode_key_values(key[3]), resource)
            except (DecodeError, ValueError) as exc:
                return None, f"{key[2]}: bad attributes: {exc}"
            counts[0] += 1
        elif counts[1] < limit:
            labels, siblings = route.overflow_labels(resource), ()
            counts[1] += 1
        else:
            return None, (f"{key[2]}: cardinality limit of {limit} series per metric and resource "
                          f"exceeded, overflow series full")
        family = self.families.get(route.family)
        if family is None:
            family = self.families[route.family] = Family(route.family, route.kind, route.help, route.buckets)
        elif family.kind is not route.kind:
            counts[0 if OVERFLOW_LABEL not in labels else 1] -= 1
            return None, f"{key[2]}: {route.family} is already a {family.kind.value}, not a {route.kind.value}"
        group = family.groups.get(labels)
        if group is None:
            group = family.groups[labels] = Group(family, labels)
            for sibling in siblings:
                family.groups.setdefault(sibling, Group(family, sibling))
                family.keep_empty = True
        series = Series(key, group, route)
        group.members.append(series)
        self._series[key] = series
        resource.num_series += 1
        return series, ""

    # -- expiry --------------------------------------------------------------------------

    def expire(self) -> int:
        """Remove series not updated for `expiry_s` (and resources left without series)."""
        deadline = self._clock() - self.config.expiry_s
        with self.lock:
            stale = [s for s in self._series.values() if s.seen_s < deadline]
            for s in stale:
                del self._series[s.key]
                group, family = s.group, s.group.family
                group.members.remove(s)
                per_metric = self._per_metric.get((s.key[0], s.key[2]))
                if per_metric is not None:
                    per_metric[1 if OVERFLOW_LABEL in group.labels else 0] -= 1
                    if per_metric == [0, 0]:
                        del self._per_metric[(s.key[0], s.key[2])]
                resource = self.resources.get(s.key[0])
                if resource is not None:
                    resource.num_series -= 1
                if not any(g.members for g in family.groups.values()):
                    del self.families[family.name]
                elif not group.members and not family.keep_empty:
                    del family.groups[group.labels]
            for key, resource in list(self.resources.items()):
                if resource.num_series <= 0 and resource.seen_s < deadline:
                    del self.resources[key]
        return len(stale)

    def num_series(self) -> int:
        with self.lock:
            return len(self._series)


def _count_points(rm) -> int:
    n = 0
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            kind = m.WhichOneof("data")
            if kind is not None:
                n += len(getattr(m, kind).data_points)
    return n
