"""The store's exposed series as Prometheus remote-write samples (what the scrape endpoint
shows, pushed instead of pulled).

`RemoteWriteSeries.collect` returns the samples of every exposed series that changed
since the last call, named and valued as the scrape endpoint shows them: counters as
``<name>`` plus the profile's counter suffix (``_total``; none for TGI and Triton),
gauges as ``<name>``, histograms as ``_bucket{le}`` (the exposition's bounds, each with
the latest exemplar that fell in it), ``_sum`` and ``_count``, plus one ``target_info``
per sender. A sample's
timestamp is the newest data point's time (when the server exported it), so
latency from export to query is what Prometheus shows. A series unchanged for
`resend_s` is sent again so it never goes stale in Prometheus (5 minutes) while
its sender is alive. A series that left the store (expired: its sender silent for
`--metric-expiry`), and a sender's ``target_info`` once it has no series, get one
staleness marker, so Prometheus ends them at once instead of 5 minutes after
their last sample. Samples of one series are sent with increasing timestamps, as
remote-write requires. The caller holds `store.lock`.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from otel_llm.canonical.instruments import Kind
from otel_llm.collector.exporter.prometheus.exposition import histogram_prefixes, latest_exemplars, number
from otel_llm.collector.exporter.prometheus.metric_store import Group, MetricStore, StoreFamily
from otel_llm.collector.exporter.remote_write.proto import STALE_NAN, PrwExemplar, PrwSeries


class _Sent(NamedTuple):
    group: Group  # held so that its id stays its own while tracked
    label_sets: list[tuple]  # of the samples last sent: what a staleness marker ends
    stamp_ms: int  # their timestamp
    sent_ms: int  # when they were sent (our wall clock)


class RemoteWriteSeries:
    """Change tracking between pushes (one instance per collector; not thread-safe).

    A resent series is stamped with its last timestamp plus the time since it was sent, so a
    sender whose clock is off keeps its own timeline and its next point is never out of order.
    """

    def __init__(self, resend_s: float = 60.0, clock=time.time):
        self.resend_ms = int(resend_s * 1000)
        self._clock = clock
        self._targets: dict[tuple, int] = {}  # target_info labels -> last timestamp sent
        self._sent: dict[int, _Sent] = {}  # id(group) -> what was last sent of it

    def collect(self, store: MetricStore) -> list[PrwSeries]:
        now_ms = int(self._clock() * 1000)
        out: list[PrwSeries] = []
        present: set[int] = set()
        for family in store.families.values():
            for group in family.groups.values():
                if not group.shown:
                    continue
                key = id(group)
                present.add(key)
                newest = max((s.time_ns for s in group.members), default=0) // 1_000_000
                sent = self._sent.get(key)
                if sent is None:
                    stamp = newest or now_ms  # a pre-created sibling has no point yet
                elif newest > sent.stamp_ms:
                    stamp = newest
                elif now_ms - sent.sent_ms >= self.resend_ms:
                    stamp = sent.stamp_ms + max(1, now_ms - sent.sent_ms)
                else:
                    continue
                first = len(out)
                _samples(out, family, group, stamp)
                self._sent[key] = _Sent(group, [s.labels for s in out[first:]], stamp, now_ms)
        for key in [key for key in self._sent if key not in present]:
            sent = self._sent.pop(key)
            stamp = sent.stamp_ms + max(1, now_ms - sent.sent_ms)
            out.extend(PrwSeries(labels, STALE_NAN, stamp) for labels in sent.label_sets)
        live: set[tuple] = set()
        for resource in store.resources.values():
            if resource.num_series > 0:
                labels = tuple(sorted((("__name__", "target_info"),) + resource.target_pairs))
                live.add(labels)
                last = self._targets.get(labels)
                if last is None or now_ms - last >= self.resend_ms:
                    self._targets[labels] = now_ms
                    out.append(PrwSeries(labels, 1.0, now_ms))
        for labels in [labels for labels in self._targets if labels not in live]:
            out.append(PrwSeries(labels, STALE_NAN, max(now_ms, self._targets.pop(labels) + 1)))
        return out


def _labels(name: str, pairs, extra: tuple = ()) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((("__name__", name),) + tuple((k, v) for k, v in pairs if v) + extra))


def _samples(out: list[PrwSeries], family: StoreFamily, group: Group, ts_ms: int) -> None:
    members = group.members
    if family.kind is not Kind.HISTOGRAM:
        suffix = family.suffix if family.kind is Kind.COUNTER else ""
        out.append(PrwSeries(_labels(family.name + suffix, group.pairs), number(family, group), ts_ms))
        return
    with_data = [s for s in members if s.counts is not None]
    if not with_data:
        return
    counts = np.sum([np.frombuffer(s.counts, "<u8") for s in with_data], axis=0)
    if group.cache is None:
        group.cache = histogram_prefixes(family, group)
    _, pos, exposed_bounds, les, _, _ = group.cache
    cum = np.cumsum(counts)
    values = cum[pos].tolist() + [int(cum[-1])]
    exemplars = latest_exemplars(with_data, exposed_bounds)
    bucket = family.name + "_bucket"
    for bound, value, ex in zip(les, values, exemplars):
        exemplar = None
        if ex is not None:
            trace_id, span_id, ex_value, when = ex
            exemplar = PrwExemplar((("span_id", span_id.hex()), ("trace_id", trace_id.hex())), ex_value * family.scale,
                                   when // 1_000_000)
        out.append(PrwSeries(_labels(bucket, group.pairs, (("le", bound),)), float(value), ts_ms, exemplar))
    out.append(PrwSeries(_labels(family.name + "_sum", group.pairs), sum(s.sum for s in with_data) * family.scale,
                         ts_ms))
    out.append(PrwSeries(_labels(family.name + "_count", group.pairs), float(values[-1]), ts_ms))
