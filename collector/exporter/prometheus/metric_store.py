"""The collector's in-memory metric model: OTLP points in, Prometheus series out.

Every OTLP data point belongs to an *input series* (resource, scope, metric,
attributes) holding its latest cumulative state. The shim (`metric_routes.py`)
assigns each input series to an *exposed series* (`Group`) per route: a Prometheus
family name and label set. Input series whose labels coincide after the shim (vLLM's
families drop the operation dimension, say) are summed at exposition, as the
server's own `/metrics` sums them. A metric with several routes (a profile that
exposes one instrument as several families) keeps one input series per route.
Series a profile leaves out (`only`) are held in a per-sender group that is never
shown, so their points are still accepted and their sender's pre-created series
stay while they do.

Temporality: cumulative points replace the state (a new start time means the
sender restarted: the value starts again from the new point, which Prometheus
sees as a counter reset); delta points are added (one whose start is before the
previous point's time overlaps it and is refused); gauges keep the newest value.
Points older than the state are ignored.

Limits (never unbounded memory): per resource and metric (and route), at most
`cardinality_limit` input series get labels of their own; more go into one
overflow series labelled ``otel_metric_overflow="true"`` (as the OTel
specification's cardinality limits define), which sums up to another
`cardinality_limit` of them; beyond that, and beyond `max_series` in all, points
are refused and reported to the sender (OTLP partial success). Series not
updated for `expiry_s` are removed (`expire`).

Thread-safety: `ingest` parses outside the lock and applies under it; readers
(exposition, remote-write) hold `lock` while they read. One lock, held briefly.

Size: one noun, the store: input series, their placement under the shim's routes, the limits and
expiry are one state under one lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from otel_llm.collector.exporter.prometheus.known_shapes import MAX_BYTES, MAX_SHAPES, Shape, exemplar_getters
from otel_llm.collector.pdata import metrics_wire as wire
from otel_llm.collector.pdata.metrics_layout import Layout, first_resource
from otel_llm.collector.pdata.otlp_codec import PayloadError
from otel_llm.collector.processor.metric_routes import Pairs, Placement, ResourceInfo, Route, Router
from otel_llm.export.exposition import label_text

_MAX_REASONS = 5
_NO_RECORDED_VALUE = wire.FLAG_NO_RECORDED_VALUE


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
    """One input series' latest state. Histograms: `counts` is the bucket counts (not cumulative)
    as little-endian uint64 bytes, exactly as they came on the wire; `exemplars` the latest
    point's exemplars, read at exposition: a view of the request they came in, or, from an export
    of a known shape, `known_shapes.LaidOutExemplars`."""

    __slots__ = ("key", "group", "route", "start_ns", "time_ns", "seen_s", "value", "counts", "count", "sum",
                 "exemplars", "bounds_raw", "factor")

    def __init__(self, key: tuple, group: Group, route: Route, factor: float = 1.0):
        self.key, self.group, self.route = key, group, route
        self.factor = factor  # exposed value per point value (`Placement.factor`)
        self.start_ns = self.time_ns = 0
        self.seen_s = 0.0
        self.value = 0.0
        self.counts: bytes | None = None
        self.count = 0
        self.sum = 0.0
        self.exemplars = None
        self.bounds_raw: bytes | None = None  # the group's, once this series' bounds were checked


class Group:
    """One exposed Prometheus series: a family, a label set, the input series summed into it."""

    __slots__ = ("family", "labels", "pairs", "sender", "members", "bounds", "bounds_raw", "bounds_list", "cache",
                 "shown")

    def __init__(self, family: StoreFamily, pairs: Pairs, sender: Pairs, shown: bool = True):
        self.family, self.pairs, self.shown = family, pairs, shown  # shown False: series the profile leaves out
        self.labels = label_text(pairs) if shown else "\x00" + label_text(pairs)  # the key in family.groups
        self.sender = sender  # the resource's (job, instance) pairs: pre-created siblings leave with their sender
        self.members: list[Series] = []
        self.bounds: np.ndarray | None = None  # input bucket bounds shared by all members
        self.bounds_raw: bytes | None = None  # the same as packed little-endian doubles, as on the wire
        self.bounds_list: list[float] = []
        self.cache: tuple | None = None  # the exposition's line prefixes

    def set_bounds(self, bounds: np.ndarray) -> None:
        self.bounds = np.array(bounds, np.float64)
        self.bounds_raw = self.bounds.astype("<f8").tobytes()
        self.bounds_list = self.bounds.tolist()


class MetricSeries:
    """The input series of one metric of one sender (resource, scope): the unit of the cardinality limit."""

    __slots__ = ("key", "series", "own", "overflowed")

    def __init__(self, key: tuple):
        self.key = key  # (resource, scope, metric name, route index)
        self.series: dict[tuple[bytes, ...], Series] = {}  # raw attributes -> series
        self.own = self.overflowed = 0


class StoreFamily:
    """One exposed Prometheus family, shaped by the route that first fed it (families of one name in a
    profile, as Triton's `nv_trt_llm_*`, share kind, unit and part)."""

    __slots__ = ("name", "kind", "help", "buckets", "shown_buckets", "suffix", "scale", "part", "groups",
                 "keep_empty")

    def __init__(self, route: Route):
        self.name, self.kind, self.help = route.family, route.kind, route.help
        self.buckets, self.shown_buckets = route.buckets, route.shown_buckets  # input's unit; the family's
        self.suffix = route.counter_suffix  # a counter's sample name: name + suffix
        self.scale, self.part = route.scale, route.part  # exposed = value x scale; a histogram's "sum"/"count"
        self.groups: dict[str, Group] = {}
        self.keep_empty = False  # groups pre-created with no members (vLLM's labelled children)


class MetricStore:
    def __init__(self, config: StoreConfig | None = None, clock=time.monotonic):
        self.config = config or StoreConfig()
        self.router = Router(self.config.profile)
        self.lock = threading.Lock()
        self.families: dict[str, StoreFamily] = {}
        self.resources: dict[bytes, ResourceInfo] = {}
        self._metrics: dict[tuple, MetricSeries] = {}  # (resource, scope, metric name) -> its series
        self._sender_metrics: dict[bytes, dict[tuple, MetricSeries]] = {}  # the same by resource (drop_unseen's)
        self._num_series = 0
        self._routes: dict[tuple, tuple[Route, ...]] = {}  # (scope, name, kind, monotonic) -> routes; none: dropped
        # resource -> scope -> metric name -> (kind, monotonic, per route (route, its input series)): a
        # sender's metric found by its name alone, its resource and scope looked up once per request
        self._plans: dict[bytes, dict[bytes, dict[str, tuple]]] = {}
        self._shapes: dict[bytes, Shape] = {}  # a sender's first resource -> its export's last shape
        self._shape_bytes = 0  # the bound layouts' sizes, kept as shapes come and go (a sum per learn: quadratic)
        self._clock = clock

    # -- ingestion -----------------------------------------------------------------------

    def ingest(self, payload: bytes) -> IngestResult:
        """Apply one ExportMetricsServiceRequest (protobuf bytes). Raises PayloadError(400) if
        it does not parse; points it cannot take are refused and counted, never raised. An export
        shaped as its sender's last is applied without parsing it (`known_shapes`)."""
        key = first_resource(payload)
        shape = None if key is None else self._shapes.get(key)
        if shape is not None and shape.layout is not None:
            values = shape.layout.values(payload)
            if values is not None:
                now = self._clock()
                with self.lock:
                    if self._shapes.get(key) is shape:
                        return IngestResult(shape.apply(payload, values, now), 0, "")
        result = self._ingest(payload)
        if key is not None and not result.refused:
            if shape is None:
                with self.lock:
                    if len(self._shapes) >= MAX_SHAPES:
                        self._forget_shapes()
                    self._shapes.setdefault(key, Shape(None, None, 0))
            elif shape.due():
                self._learn(key, payload, shape)
        return result

    def _ingest(self, payload: bytes) -> IngestResult:
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
                scopes = self._plans.get(resource_key)
                if scopes is None:
                    scopes = self._plans[resource_key] = {}
                for sm in rm.scope_metrics:
                    scope = sm.scope  # (read once: each read is a new bytes object, hashed anew)
                    plan = scopes.get(scope)
                    if plan is None:
                        plan = scopes[scope] = {}
                    for metric in sm.metrics[:]:
                        ok, bad, reason = self._metric(resource, resource_key, scope, plan, metric, now)
                        accepted += ok
                        refused += bad
                        if reason and len(reasons) < _MAX_REASONS:
                            reasons[reason] = None
        return IngestResult(accepted, refused, "; ".join(reasons))

    def _metric(self, resource: ResourceInfo, resource_key: bytes, scope: bytes, plan: dict, metric, now: float):
        kind = metric.WhichOneof("data")
        if kind is None:
            return 0, 0, ""
        data = getattr(metric, kind)
        points = data.data_points[:]  # (slices: a list of the points in one C call, cheaper to iterate)
        name = metric.name
        if kind == "gauge":
            monotonic, temporality = False, wire.CUMULATIVE
        elif kind in ("sum", "histogram"):
            monotonic, temporality = kind == "sum" and data.is_monotonic, data.aggregation_temporality
            if temporality not in (wire.DELTA, wire.CUMULATIVE):
                return 0, len(points), (f"{name}: aggregation temporality {temporality} is neither delta nor "
                                        "cumulative" if temporality else f"{name}: aggregation temporality unspecified")
        else:
            return 0, len(points), f"{name}: {kind} points are not supported (use explicit buckets)"
        entry = plan.get(name)
        if entry is None or entry[0] != kind or entry[1] != monotonic:
            if entry is not None:
                self._forget_shapes()
            routes = self._routes.get((scope, name, kind, monotonic))
            if routes is None:
                try:
                    routes = self._routes[(scope, name, kind, monotonic)] = self.router.route(scope, metric, kind,
                                                                                              monotonic)
                except (DecodeError, ValueError) as exc:
                    return 0, len(points), f"{name}: {exc}"
            entry = plan[name] = (kind, monotonic, tuple(
                (route, self._metric_series((resource_key, scope, name, i))) for i, route in enumerate(routes)))
        known = entry[2]
        if not known:
            return len(points), 0, ""  # a canonical instrument the profile does not expose
        apply = self._histogram_points if kind == "histogram" else self._number_points
        delta = temporality == wire.DELTA
        bad, reason = 0, ""
        for route, series in known:  # a point refused on any route is counted refused once
            _, refused, why = apply(points, delta, resource, series, route, now)
            if refused > bad:
                bad, reason = refused, why
        return len(points) - bad, bad, (f"{name}: {reason}" if reason else "")

    def _learn(self, key: bytes, payload: bytes, last: Shape) -> None:
        layout = Layout.of(payload)
        with self.lock:
            bound = None if layout is None else self._bind(layout)
            old = self._shapes.get(key)
            if old is not None and old.layout is not None:
                self._shape_bytes -= old.layout.size
            if bound is not None:
                if self._shape_bytes + layout.size > MAX_BYTES:
                    self._forget_shapes()
                self._shape_bytes += layout.size
            self._shapes[key] = Shape(layout, bound, last.next_backoff())

    def _bind(self, layout: Layout) -> tuple | None:
        """Each point of `layout` -> the series this store put it in, for `Shape.apply`; None when one is
        missing, or a point is one `Shape.apply` does not apply as the full path would (see there)."""
        resources, seen, numbers, histograms = {}, [], [], []
        for m in layout.metrics:
            resource = self.resources.get(m.resource)
            entry = self._plans.get(m.resource, {}).get(m.scope, {}).get(m.name)
            if resource is None or entry is None or entry[:2] != (m.kind, m.monotonic) or (
                    m.kind != "gauge" and m.temporality != wire.CUMULATIVE):
                return None
            resources[m.resource] = resource
            for _, metric in entry[2]:
                for p in m.points:
                    s = metric.series.get(p.attributes)
                    if s is None:
                        return None
                    if p.flags & _NO_RECORDED_VALUE:
                        seen.append(s)
                    elif m.kind != "histogram":
                        numbers.append((s, p.start, p.time, p.value))
                    elif p.counts == Layout.EMPTY or p.bounds != s.bounds_raw:
                        return None
                    else:
                        histograms.append((s, p.start, p.time, p.count, p.sum, p.counts,
                                           exemplar_getters(p.exemplars)))
        return tuple(resources.values()), tuple(seen), tuple(numbers), tuple(histograms)

    def _forget_shapes(self) -> None:
        self._shapes.clear()
        self._shape_bytes = 0

    def _metric_series(self, key: tuple) -> MetricSeries:
        series = self._metrics.get(key)
        if series is None:
            series = self._metrics[key] = MetricSeries(key)
            self._sender_metrics.setdefault(key[0], {})[key] = series
        return series

    # The two loops below are the ingest hot path (one iteration per data point): the series
    # key is the raw attribute bytes, and values are read as few times as possible.

    def _number_points(self, points, delta, resource, metric, route, now):
        bad = 0
        reason = ""
        series_map = metric.series
        for p in points:
            attributes = tuple(p.attributes[:])  # a slice converts in one C call: half the cost
            s = series_map.get(attributes)
            if s is None:
                s, reason_new = self._new_series(metric, attributes, resource, route)
                if s is None:
                    bad += 1
                    reason = reason_new
                    continue
            s.seen_s = now
            if p.flags & _NO_RECORDED_VALUE:
                continue
            t, start = p.time_unix_nano, p.start_time_unix_nano
            value = p.as_double or p.as_int  # a oneof: the unset one reads 0
            if not delta:
                if t >= s.time_ns or start != s.start_ns:  # newer, or the sender restarted
                    s.value, s.start_ns, s.time_ns = value, start, t
            elif s.time_ns and start < s.time_ns:
                bad += 1
                reason = "delta point overlaps the previous one"
            else:
                if not s.start_ns:
                    s.start_ns = start
                s.value += value
                s.time_ns = t
        return len(points) - bad, bad, reason

    def _histogram_points(self, points, delta, resource, metric, route, now):
        bad = 0
        reason = ""
        series_map = metric.series
        for p in points:
            attributes = tuple(p.attributes[:])  # a slice converts in one C call: half the cost
            s = series_map.get(attributes)
            if s is None:
                s, reason_new = self._new_series(metric, attributes, resource, route)
                if s is None:
                    bad += 1
                    reason = reason_new
                    continue
            s.seen_s = now
            if p.flags & _NO_RECORDED_VALUE:
                continue
            t, start = p.time_unix_nano, p.start_time_unix_nano
            restart = start != s.start_ns
            if delta:
                if s.time_ns and start < s.time_ns:
                    bad += 1
                    reason = "delta point overlaps the previous one"
                    continue
            elif t < s.time_ns and not restart:
                continue  # older than what we have
            counts = p.bucket_counts
            if p.explicit_bounds != s.bounds_raw or (not counts and p.count):
                counts, why = self._odd_histogram(s, p)
                if why:
                    bad += 1
                    reason = why
                    continue
            if delta and s.counts is not None:
                s.counts = (np.frombuffer(s.counts, "<u8") + np.frombuffer(counts, "<u8")).tobytes()
                s.count += p.count
                s.sum += p.sum
            else:
                s.counts, s.count, s.sum, s.start_ns = counts, p.count, p.sum, start
            exemplars = p.exemplars
            if exemplars:
                s.exemplars = exemplars  # the latest point's, as the OpenTelemetry Collector keeps them
            elif restart and not delta:
                s.exemplars = None
            s.time_ns = t
        return len(points) - bad, bad, reason

    @staticmethod
    def _odd_histogram(s: Series, p) -> tuple[bytes, str]:
        """The first point of a group (its bounds are set here), or bounds that differ, or counts
        written unpacked: -> (bucket counts as little-endian uint64 bytes, why refused or "")."""
        counts, bounds = wire.histogram_arrays(p)
        group = s.group
        if group.bounds_raw is None:
            group.set_bounds(bounds)
        elif not np.array_equal(bounds, group.bounds):
            return b"", "bucket bounds differ from the series' earlier ones"
        if len(counts) != len(group.bounds) + 1:
            return b"", f"{len(counts)} bucket counts for {len(group.bounds)} bounds"
        s.bounds_raw = group.bounds_raw
        return counts.astype("<u8").tobytes(), ""

    def _new_series(self, metric: MetricSeries, attributes: tuple, resource: ResourceInfo, route: Route):
        if self._num_series >= self.config.max_series:
            return None, f"the collector holds its limit of {self.config.max_series} series"
        limit = self.config.cardinality_limit
        overflow = metric.own >= limit
        if not overflow:
            try:
                place = route.labels(wire.decode_key_values(attributes), resource)
            except (DecodeError, ValueError) as exc:
                return None, f"bad attributes: {exc}"
        elif metric.overflowed < limit:
            place = Placement(route.overflow_labels(resource))
        else:
            return None, f"cardinality limit of {limit} series per metric and sender exceeded, overflow series full"
        family = self.families.get(route.family)
        if family is None:
            family = self.families[route.family] = StoreFamily(route)
        elif family.kind is not route.kind:
            return None, f"{route.family} is already a {family.kind.value}, not a {route.kind.value}"
        candidate = Group(family, place.pairs, resource.pairs, place.shown)
        group = family.groups.get(candidate.labels)
        if group is None:
            group = family.groups[candidate.labels] = candidate
            for sibling in place.siblings:
                sibling_text = label_text(sibling)
                if sibling_text not in family.groups:
                    family.groups[sibling_text] = Group(family, sibling, resource.pairs)
                family.keep_empty = True
        series = Series((metric, attributes, overflow), group, route, place.factor)
        group.members.append(series)
        metric.series[attributes] = series
        if overflow:
            metric.overflowed += 1
        else:
            metric.own += 1
        self._num_series += 1
        resource.num_series += 1
        return series, ""

    # -- expiry --------------------------------------------------------------------------

    def expire(self) -> int:
        """Remove series not updated for `expiry_s` (and resources left without series)."""
        deadline = self._clock() - self.config.expiry_s
        removed = 0
        with self.lock:
            for metric_key, metric in list(self._metrics.items()):
                removed += self._drop_older(metric_key, metric, deadline)
            for key, resource in list(self.resources.items()):
                if resource.num_series <= 0 and resource.seen_s < deadline:
                    del self.resources[key]
                    self._plans.pop(key, None)
                    self._forget_shapes()
        return removed

    def drop_unseen(self, resource_key: bytes, since: float) -> int:
        """Remove the sender's series not updated since `since` (this store's clock): what a scrape
        target stopped exposing, or everything but `up` after a failed scrape (Prometheus marks
        those stale)."""
        with self.lock:
            return sum(self._drop_older(key, metric, since)
                       for key, metric in list(self._sender_metrics.get(resource_key, {}).items()))

    def clock(self) -> float:
        return self._clock()

    def _drop_older(self, metric_key: tuple, metric: MetricSeries, since: float) -> int:
        stale = [s for s in metric.series.values() if s.seen_s < since]
        for s in stale:
            self._remove(metric, s)
        if not metric.series:
            del self._metrics[metric_key]
            sender = self._sender_metrics[metric_key[0]]
            del sender[metric_key]
            if not sender:
                del self._sender_metrics[metric_key[0]]
            resource_key, scope, name, _ = metric_key
            plan = self._plans.get(resource_key, {}).get(scope, {})
            if any(m is metric for _, m in plan.get(name, (None, None, ()))[2]):
                del plan[name]  # its next point finds the routes again, and a new MetricSeries
        return len(stale)

    def _remove(self, metric: MetricSeries, s: Series) -> None:
        _, attributes, overflow = s.key
        del metric.series[attributes]
        self._forget_shapes()
        if overflow:
            metric.overflowed -= 1
        else:
            metric.own -= 1
        self._num_series -= 1
        resource = self.resources.get(metric.key[0])
        if resource is not None:
            resource.num_series -= 1
        group, family = s.group, s.group.family
        group.members.remove(s)
        if group.members:
            return
        # An empty group goes, and with it, once its sender has no member left in the family (in a
        # group shown or not), the empty siblings pre-created for that sender.
        gone = [group]
        if family.keep_empty:
            gone = [g for g in family.groups.values() if g.sender == group.sender]
            if any(g.members for g in gone):
                return
        for g in gone:
            del family.groups[g.labels]
        if not family.groups:
            del self.families[family.name]

    def num_series(self) -> int:
        return self._num_series


def _count_points(rm) -> int:
    n = 0
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            kind = m.WhichOneof("data")
            if kind is not None:
                n += len(getattr(m, kind).data_points)
    return n
