"""The engine lane under the request timeline: one lane of steps per server engine.

A lane comes from the `engine steps` window spans (`otel_llm.export.lane_spans`) of one process
(`service.instance.id`, or vLLM's process id) and engine, their steps joined in time order. For a request row, `steps_of`
gives the steps it ran in (same instance, from its prefill's start to its decode's end) and
`interference` the steps of its decode that computed prompt tokens, each with the requests whose
prefill ran then: the prefills that slowed its inter-token latency.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from otel_llm.collector.timeline.rows import TimelineRow
from otel_llm.collector.tracestore.query import StoredSpan, instance_id, plain_value, service_name
from otel_llm.export.lane_spans import LANE_SPAN, STEP_COLUMNS, lane_steps


class Lane(NamedTuple):
    service: str
    instance: str  # service.instance.id (or vLLM's process id: `query.instance_id`), "" if none
    model: str
    engine: str
    steps: dict[str, np.ndarray]  # lane_spans.STEP_COLUMNS (ns for times), in time order

    def as_json(self) -> dict:
        """For the web view: times in µs since the epoch (exact in a JSON number), -1 for no forward time."""
        s = self.steps
        out = {"service": self.service, "instance": self.instance, "model": self.model, "engine": self.engine,
               "start_us": (s["start_ns"] // 1000).tolist(), "end_us": (s["end_ns"] // 1000).tolist(),
               "forward_us": np.where(s["forward_ns"] >= 0, s["forward_ns"] // 1000, -1).tolist(),
               "kv_usage": s["kv_usage"].tolist()}
        out.update((c, s[c].tolist()) for c in STEP_COLUMNS[4:])  # the counts
        return out


class Interference(NamedTuple):
    start_ns: int
    end_ns: int
    prefill_tokens: int
    num_requests: int
    prefilling: tuple[str, ...]  # trace ids of the requests whose prefill ran in this step


def lanes_from_spans(spans: Iterable[StoredSpan], start_ns: int = 0, end_ns: int = (1 << 63) - 1) -> list[Lane]:
    """The lanes of `spans` (the window spans among them), steps overlapping [start_ns, end_ns] only,
    ordered by service, instance and engine; a step sent twice (a window exported again) counts once."""
    parts: dict[tuple[str, str, str, str], list[dict[str, np.ndarray]]] = {}
    for stored in spans:
        span = stored.span
        if span.name != LANE_SPAN:
            continue
        attrs = {kv.key: plain_value(kv.value) for kv in span.attributes}
        cols = lane_steps(attrs, span.start_time_unix_nano)
        if cols is None:
            continue
        key = (service_name(stored.resource), instance_id(stored.resource),
               str(attrs.get("gen_ai.request.model", "")), str(attrs.get("otel_llm.engine", "")))
        parts.setdefault(key, []).append(cols)
    lanes = []
    for key in sorted(parts):
        joined = {c: np.concatenate([p[c] for p in parts[key]]) for c in STEP_COLUMNS}
        order = np.argsort(joined["end_ns"], kind="stable")
        joined = {c: v[order] for c, v in joined.items()}
        keep = (joined["end_ns"] >= start_ns) & (joined["start_ns"] <= end_ns)
        ends = joined["end_ns"]
        keep[1:] &= ends[1:] != ends[:-1]  # the same step twice
        lanes.append(Lane(*key, {c: v[keep] for c, v in joined.items()}))
    return [lane for lane in lanes if len(lane.steps["end_ns"])]


LANE_WINDOWS = 100_000  # window spans read for one timeline at most
_LONGEST_WINDOW_US = 120_000_000  # a window span that started this long before the timeline's start is looked at


def timeline_lanes(store, start_us: int, end_us: int, wanted=None) -> list[Lane]:
    """The lanes of a trace store over [start_us, end_us], those `wanted` (a `RowFilter`: its model and
    instance) only."""
    spans = store.spans_named(LANE_SPAN, start_us, end_us, _LONGEST_WINDOW_US, LANE_WINDOWS)
    lanes = lanes_from_spans(spans, start_us * 1000, end_us * 1000)
    if wanted is not None:
        lanes = [lane for lane in lanes if (not wanted.model or lane.model == wanted.model)
                 and (not wanted.instance or lane.instance == wanted.instance)]
    return lanes


def _lane_of(row: TimelineRow, lanes: list[Lane]) -> Lane | None:
    return next((lane for lane in lanes
                 if lane.instance == row.instance and (not row.model or lane.model == row.model)), None)


def steps_of(row: TimelineRow, lanes: list[Lane]) -> tuple[Lane, np.ndarray] | None:
    """The lane of `row`'s engine and the indexes of the steps it ran in (those that ended from its
    prefill's start to its decode's end); None when no lane of its instance was kept."""
    lane = _lane_of(row, lanes)
    if lane is None or row.prefill is None:
        return None
    last = (row.decode or row.prefill)[1]
    ends = lane.steps["end_ns"]
    return lane, np.flatnonzero((ends >= row.prefill[0]) & (ends <= last))


def interference(row: TimelineRow, lanes: list[Lane], rows: list[TimelineRow]) -> list[Interference]:
    """The steps of `row`'s decode (after its first token) that computed prompt tokens, each with the
    requests of the same instance whose prefill ran in it."""
    found = steps_of(row, lanes)
    if found is None or row.decode is None:
        return []
    lane, index = found
    s = lane.steps
    index = index[(s["end_ns"][index] > row.decode[0]) & (s["prefill_tokens"][index] > 0)]
    others = [r for r in rows if r.instance == row.instance and r.trace_id != row.trace_id and r.prefill is not None]
    out = []
    for i in index.tolist():
        a, b = int(s["start_ns"][i]), int(s["end_ns"][i])
        prefilling = tuple(r.trace_id for r in others if r.prefill[0] < b and r.prefill[1] >= a)
        out.append(Interference(a, b, int(s["prefill_tokens"][i]), int(s["num_requests"][i]), prefilling))
    return out
