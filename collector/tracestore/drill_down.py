"""Drilling into the fleet overview: the requests of a region (a time range, optionally a latency
range of one metric and a service), chosen meaningfully when there are more than can be listed, and
what sets them apart from the rest of the window.

`choose`: how many requests lie in the region, and which to list: all of them when they fit (by
start); else the failed ones (slowest first by the region's metric, e2e without one), the slowest,
and an even sample across the time range (the first request not chosen yet at or after each of
evenly spaced instants), a quarter, a quarter and the rest of the limit, and says so (`chosen`).

`compare` (BubbleUp): per dimension (service, model, instance, LoRA adapter, prompt length, finish
reason, preempted), how many requests of the region and of the rest of the time range have each
value, the dimensions and values whose shares differ most first.

Both read the ``requests`` table through its ``requests_window`` index (start, latencies, error);
`compare` reads the rows of the whole time range.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, replace

METRIC_COLUMNS = {"ttft": "ttft_s", "e2e": "e2e_s", "queue": "queue_s", "itl": "itl_s"}
DIMENSIONS = ("service", "model", "instance", "lora", "prompt_tokens", "finish_reason", "preempted")
# prompt length buckets: (label, upper bound exclusive)
PROMPT_BUCKETS = (("<128", 128), ("128-511", 512), ("512-2047", 2048), ("2048-8191", 8192), (">=8192", None))


@dataclass(frozen=True)
class Region:
    """Requests that started in [start_us, end_us], of `service_id` (None: any), whose `metric` is in
    [low_s, high_s) (None: unbounded; without a metric, any latency). Raises ValueError on a bad one."""

    start_us: int
    end_us: int
    metric: str | None = None
    low_s: float | None = None
    high_s: float | None = None
    service_id: int | None = None

    def __post_init__(self) -> None:
        if self.metric is not None and self.metric not in METRIC_COLUMNS:
            raise ValueError(f"unknown metric {self.metric!r}; expected one of {', '.join(METRIC_COLUMNS)}")
        for name in ("low_s", "high_s"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name.removesuffix('_s')} must be a finite number of seconds >= 0, got {v!r}")
        if (self.low_s is not None or self.high_s is not None) and self.metric is None:
            raise ValueError("a latency range needs a metric (ttft, e2e, queue or itl)")
        if self.start_us > self.end_us:
            raise ValueError("start time must be before end time")

    def window(self) -> tuple[str, list]:
        """The time range (and service) alone, as SQL on ``requests r``."""
        where, args = "r.start_us BETWEEN ? AND ?", [self.start_us, self.end_us]
        if self.service_id is not None:
            where, args = where + " AND r.service_id = ?", args + [self.service_id]
        return where, args

    def latency(self) -> tuple[str, list]:
        """The latency range alone, as SQL on ``requests r`` ("1" when there is none)."""
        if self.metric is None:
            return "1", []
        col = "r." + METRIC_COLUMNS[self.metric]
        parts, args = [f"{col} IS NOT NULL"], []
        if self.low_s is not None:
            parts, args = parts + [f"{col} >= ?"], args + [self.low_s]
        if self.high_s is not None:
            parts, args = parts + [f"{col} < ?"], args + [self.high_s]
        return " AND ".join(parts), args

    def where(self) -> tuple[str, list]:
        (w, wa), (lat, la) = self.window(), self.latency()
        return f"{w} AND {lat}", wa + la


def choose(db: sqlite3.Connection, region: Region, limit: int) -> tuple[int, list[bytes], str]:
    """(requests in the region, the trace ids to list, how they were chosen)."""
    where, args = region.where()
    matched, first, last = db.execute(
        f"SELECT count(*), min(r.start_us), max(r.start_us) FROM requests r WHERE {where}", args).fetchone()
    if matched <= limit:
        ids = db.execute(f"SELECT r.id FROM requests r WHERE {where} ORDER BY r.start_us LIMIT ?", args + [limit])
        return matched, _trace_ids(db, [i for (i,) in ids]), "all"
    col = "r." + METRIC_COLUMNS[region.metric or "e2e"]
    quarter = max(1, limit // 4)
    rows: dict[int, None] = {}
    for extra in ("AND r.error = 1", ""):  # the failed, then the slowest
        found = db.execute(f"SELECT r.id FROM requests r WHERE {where} {extra} ORDER BY {col} DESC LIMIT ?",
                           args + [quarter + len(rows)]).fetchall()
        before = len(rows)
        for (i,) in found:
            if len(rows) - before == quarter:
                break
            rows.setdefault(i)
    left = limit - len(rows)
    span = last - first + 1  # (a window open at either end is sampled where its requests are)
    for k in range(left):  # an even sample across the time range
        later, later_args = replace(region, start_us=first + span * (2 * k + 1) // (2 * left)).where()
        for (i,) in db.execute(f"SELECT r.id FROM requests r WHERE {later} ORDER BY r.start_us LIMIT 8", later_args):
            if i not in rows:  # the first one not chosen yet
                rows[i] = None
                break
    what = "failed" if region.metric is None else f"failed (slowest {region.metric} first)"
    return matched, _trace_ids(db, list(rows)), f"the {what}, the slowest by {region.metric or 'e2e'} and an even sample"


def _trace_ids(db: sqlite3.Connection, row_ids: list[int]) -> list[bytes]:
    """The trace ids of request rows, in their order, each once."""
    out: dict[bytes, None] = {}
    for i in range(0, len(row_ids), 500):
        chunk = row_ids[i:i + 500]
        found = dict(db.execute(f"SELECT id, trace_id FROM requests WHERE id IN ({','.join('?' * len(chunk))})", chunk))
        for row in chunk:
            out.setdefault(found[row])
    return list(out)


def compare(db: sqlite3.Connection, region: Region) -> list[dict]:
    """BubbleUp: per dimension, each value's requests in the region and in the rest of the time range,
    with their shares; the dimensions whose shares differ most first, their values likewise."""
    (window, wa), (latency, la) = region.window(), region.latency()
    prompt = "CASE " + " ".join(f"WHEN r.prompt_tokens < {bound} THEN '{label}'" for label, bound in PROMPT_BUCKETS
                                if bound) + f" WHEN r.prompt_tokens IS NOT NULL THEN '{PROMPT_BUCKETS[-1][0]}' END"
    services = dict(db.execute("SELECT id, name FROM services"))
    rows = [(services.get(r[0], ""), *r[1:]) for r in db.execute(
        f"SELECT r.service_id, r.model, r.instance, r.lora, {prompt}, r.finish_reason, r.preempted, "
        f"sum({latency}), count(*) FROM requests r WHERE {window} GROUP BY 1, 2, 3, 4, 5, 6, 7", la + wa)]
    selected = sum(r[7] for r in rows)
    rest = sum(r[8] for r in rows) - selected
    out = []
    for d, name in enumerate(DIMENSIONS):
        counts: dict[str, list[int]] = {}
        for r in rows:
            value = r[d]
            key = ("yes" if value else "no") if name == "preempted" else "" if value is None else str(value)
            c = counts.setdefault(key, [0, 0])
            c[0] += r[7]
            c[1] += r[8] - r[7]
        values = [{"value": v, "selected": a, "rest": b, "selected_share": round(a / selected, 4) if selected else 0.0,
                   "rest_share": round(b / rest, 4) if rest else 0.0} for v, (a, b) in counts.items()]
        for v in values:
            v["difference"] = round(v["selected_share"] - v["rest_share"], 4)
        values.sort(key=lambda v: -abs(v["difference"]))
        out.append({"dimension": name, "values": values,
                    "difference": max((abs(v["difference"]) for v in values), default=0.0)})
    out.sort(key=lambda d: -d["difference"])
    return out
