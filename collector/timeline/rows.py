"""The request timeline: every request of a time window as one row (queue, prefill and decode
segments, first-token and preemption marks, finish reason), and the load they add up to.

A row comes from one trace: its request span (one carrying `gen_ai.latency.*`: otel-llm's
`{operation} {model}` span, or vLLM's `llm_request`) and that span's `queue`, `prefill` and
`decode` children (otel-llm's own, or the collector's derived ones for vLLM, see
`phase_spans`). The first token is the request span's `first_token` event, else the derived
`prefill`'s; preemptions are the request span's `preempted` events. Times are the spans' own,
in ns since the epoch, so every boundary drawn (web view, PNG) is a span timestamp.

`load` counts, between each two row boundaries, how many requests were waiting (in `queue`)
and running (in `prefill` or `decode`): the scheduler's step-level load as the spans saw it.
`RowFilter` picks the rows a view shows (model, instance, finish reason, TTFT and e2e above).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from otel_llm.collector.pdata.request_span import request_facts
from otel_llm.collector.tracestore.query import StoredSpan, instance_id, plain_value, service_name

PHASES = ("queue", "prefill", "decode")


class TimelineRow(NamedTuple):
    trace_id: str  # hex
    span_id: str  # the request span's, hex
    service: str
    instance: str  # service.instance.id (or vLLM's process id: `query.instance_id`), "" if none
    model: str  # gen_ai.request.model, "" if none
    name: str  # the request span's name
    start_ns: int
    end_ns: int
    queue: tuple[int, int] | None  # (start_ns, end_ns) of each phase span, None if missing
    prefill: tuple[int, int] | None
    decode: tuple[int, int] | None
    first_token_ns: int | None
    preemptions_ns: tuple[int, ...]
    finish_reason: str | None  # stop, length, abort, error, ... (error.type when it failed)
    ttft_s: float | None
    e2e_s: float | None

    def as_json(self) -> dict:
        """The row for the web view: times as integers (ns; JSON numbers lose nothing below 2^53
        only for µs, so ns go as strings) and the phase spans as [start, end] pairs."""
        out = self._asdict()
        for key in ("start_ns", "end_ns", "first_token_ns"):
            out[key] = None if out[key] is None else str(out[key])
        for key in PHASES:
            out[key] = None if out[key] is None else [str(t) for t in out[key]]
        out["preemptions_ns"] = [str(t) for t in self.preemptions_ns]
        return out


class LoadPoint(NamedTuple):
    t_ns: int  # from here to the next point
    waiting: int
    running: int

    def as_json(self) -> dict:
        """The point for the web view, the time as a string (ns, as in `TimelineRow.as_json`)."""
        return {"t_ns": str(self.t_ns), "waiting": self.waiting, "running": self.running}


@dataclass(frozen=True)
class RowFilter:
    """Which rows to show: those matching every given criterion ("" and None match anything).
    The thresholds are exclusive and in seconds; a row without a TTFT (or e2e) matches no
    threshold on it. Raises ValueError, naming the value, on a negative or non-finite threshold."""

    model: str = ""
    instance: str = ""  # service.instance.id
    finish_reason: str = ""
    ttft_above_s: float | None = None
    e2e_above_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_above_s", "e2e_above_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")

    def matches(self, row: TimelineRow) -> bool:
        return ((not self.model or row.model == self.model)
                and (not self.instance or row.instance == self.instance)
                and (not self.finish_reason or row.finish_reason == self.finish_reason)
                and _above(row.ttft_s, self.ttft_above_s) and _above(row.e2e_s, self.e2e_above_s))


def _above(value: float | None, threshold: float | None) -> bool:
    return threshold is None or (value is not None and value > threshold)


def rows_from_traces(traces: Iterable[list[StoredSpan]]) -> list[TimelineRow]:
    """One row per request span in `traces`, ordered by start."""
    rows = []
    for spans in traces:
        children: dict[bytes, dict[str, StoredSpan]] = {}
        for stored in spans:
            if stored.span.name in PHASES and stored.span.parent_span_id:
                children.setdefault(stored.span.parent_span_id, {})[stored.span.name] = stored
        for stored in spans:
            row = _row(stored, children.get(stored.span.span_id, {}))
            if row is not None:
                rows.append(row)
    rows.sort(key=lambda r: (r.start_ns, r.trace_id))
    return rows


def _row(stored: StoredSpan, phases: dict[str, StoredSpan]) -> TimelineRow | None:
    span = stored.span
    facts = request_facts(span)
    if not facts.is_request:
        return None
    attrs = {kv.key: kv.value for kv in span.attributes}
    model = attrs.get("gen_ai.request.model")
    first_token = next((e.time_unix_nano for e in span.events if e.name == "first_token"), None)
    if first_token is None and "prefill" in phases:
        first_token = next((e.time_unix_nano for e in phases["prefill"].span.events if e.name == "first_token"), None)
    return TimelineRow(
        span.trace_id.hex(), span.span_id.hex(), service_name(stored.resource),
        instance_id(stored.resource), "" if model is None else str(plain_value(model)),
        span.name, span.start_time_unix_nano, span.end_time_unix_nano,
        *(_interval(phases.get(name)) for name in PHASES), first_token,
        tuple(sorted(e.time_unix_nano for e in span.events if e.name == "preempted")),
        facts.error_type or facts.finish_reason, facts.ttft_s, facts.e2e_s,
    )


def _interval(stored: StoredSpan | None) -> tuple[int, int] | None:
    return None if stored is None else (stored.span.start_time_unix_nano, stored.span.end_time_unix_nano)


def load(rows: Iterable[TimelineRow]) -> list[LoadPoint]:
    """Waiting and running requests over time, one point per change (the last point is 0/0)."""
    deltas: dict[int, list[int]] = {}
    for row in rows:
        for phase, (dw, dr) in (("queue", (1, 0)), ("prefill", (0, 1)), ("decode", (0, 1))):
            interval = getattr(row, phase)
            if interval is None or interval[1] <= interval[0]:
                continue
            for t, sign in ((interval[0], 1), (interval[1], -1)):
                d = deltas.setdefault(t, [0, 0])
                d[0] += sign * dw
                d[1] += sign * dr
    points, waiting, running = [], 0, 0
    for t in sorted(deltas):
        waiting += deltas[t][0]
        running += deltas[t][1]
        points.append(LoadPoint(t, waiting, running))
    return points
