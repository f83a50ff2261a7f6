"""The fleet overview of the trace store: every request of a window as a latency heatmap and a load
lane, counted as requests are stored, so an hour of a busy fleet is one small aggregate query.

Per 10 s (``STEP_US``, by the request's start), service and metric (TTFT, e2e, queue time, mean
inter-token latency): how many requests fell in each latency bucket (``PER_DECADE`` = 10 log-spaced
buckets per decade, 1 µs to 10^5 s; bucket ``NO_VALUE`` for a request without that figure: failed
before its first token, or one output token for ITL), and of them how many failed, were aborted or
were preempted, in ``request_heat``. And per 10 s and service, the request-seconds spent waiting
(from a request's start to the end of its queue time) and running (from there to its end), in
``request_load``: divided by 10 s, the mean number of requests waiting and running. Both are
written in the writer's transaction (`record`, only requests new to the store); a store from before
these tables counts its stored requests once when opened (`create`).

`heatmap` answers a window in at most ``MAX_COLUMNS`` columns of whole 10 s steps: the non-empty
cells (column, bucket, requests, failed, aborted, preempted) and the load per column.
"""

from __future__ import annotations

import math
import sqlite3
from collections import defaultdict

STEP_US = 10_000_000
PER_DECADE = 10
LOWEST, HIGHEST = -6 * PER_DECADE, 5 * PER_DECADE  # 1 µs .. 10^5 s
NO_VALUE = -1000  # the bucket of a request without the figure
METRICS = ("ttft", "e2e", "queue", "itl")
MAX_COLUMNS = 240

SCHEMA = """
CREATE TABLE IF NOT EXISTS request_heat (metric INTEGER NOT NULL, t INTEGER NOT NULL, service_id INTEGER NOT NULL,
    bucket INTEGER NOT NULL, requests INTEGER NOT NULL, failed INTEGER NOT NULL, aborted INTEGER NOT NULL,
    preempted INTEGER NOT NULL, PRIMARY KEY (metric, t, service_id, bucket)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS request_load (t INTEGER NOT NULL, service_id INTEGER NOT NULL, waiting_s REAL NOT NULL,
    running_s REAL NOT NULL, PRIMARY KEY (t, service_id)) WITHOUT ROWID;
"""
_UPSERT_HEAT = ("INSERT INTO request_heat VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (metric, t, service_id, bucket) DO "
                "UPDATE SET requests = requests + excluded.requests, failed = failed + excluded.failed, "
                "aborted = aborted + excluded.aborted, preempted = preempted + excluded.preempted")
_UPSERT_LOAD = ("INSERT INTO request_load VALUES (?,?,?,?) ON CONFLICT (t, service_id) DO UPDATE SET "
                "waiting_s = waiting_s + excluded.waiting_s, running_s = running_s + excluded.running_s")
# the requests table's columns `_add` reads, in its order
_COLUMNS = "id, service_id, start_us, ttft_s, e2e_s, queue_s, itl_s, error, error_type, preempted"


def create(db: sqlite3.Connection) -> None:
    """Creates the tables (inside the caller's transaction); fills them from the stored requests when new."""
    new = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'request_heat'").fetchone() is None
    for statement in filter(str.strip, SCHEMA.split(";")):
        db.execute(statement)
    if new:
        rows = db.execute(f"SELECT {_COLUMNS} FROM requests")
        while chunk := rows.fetchmany(100_000):
            _add(db, chunk)


def record(db: sqlite3.Connection, rows: list[tuple], inserted: set[int]) -> None:
    """Counts a batch of request rows just inserted (the store's `requests` rows: id, trace, span, service,
    name, start, duration, ttft, e2e, queue, error, error type, finish reason, itl, preempted; `inserted`:
    the span ids that were new)."""
    _add(db, [(r[0], r[3], r[5], r[7], r[8], r[9], r[13], r[10], r[11], r[14]) for r in rows if r[0] in inserted])


def expire(db: sqlite3.Connection, cutoff_us: int) -> None:
    """Forgets the steps that began before `cutoff_us` (retention)."""
    for table in ("request_heat", "request_load"):
        db.execute(f"DELETE FROM {table} WHERE t < ?", (cutoff_us // STEP_US,))


def bucket(seconds: float | None) -> int:
    """The latency bucket of a figure (NO_VALUE for none, or not above 0)."""
    if seconds is None or not seconds > 0 or math.isinf(seconds):
        return NO_VALUE
    return min(max(math.floor(math.log10(seconds) * PER_DECADE), LOWEST), HIGHEST)


def bucket_bounds(b: int) -> tuple[float, float]:
    """[low, high) seconds of a bucket (the lowest and highest also hold what lies beyond them)."""
    return 10 ** (b / PER_DECADE), 10 ** ((b + 1) / PER_DECADE)


def _add(db: sqlite3.Connection, requests: list[tuple]) -> None:
    """requests: (id, service_id, start_us, ttft_s, e2e_s, queue_s, itl_s, error, error_type, preempted)."""
    if not requests:
        return
    heat: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    load: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for _, service, start, ttft, e2e, queue, itl, error, error_type, preempted in requests:
        t = start // STEP_US
        failed, aborted, pre = (1 if error else 0), (1 if error_type == "abort" else 0), (1 if preempted else 0)
        for metric, value in enumerate((ttft, e2e, queue, itl)):
            cell = heat[(metric, t, service, bucket(value))]
            cell[0] += 1
            cell[1] += failed
            cell[2] += aborted
            cell[3] += pre
        if e2e is not None and e2e > 0:
            queued = start + int(min(max(queue or 0.0, 0.0), e2e) * 1e6)
            _spread(load, service, start, queued, 0)
            _spread(load, service, queued, start + int(e2e * 1e6), 1)
    db.executemany(_UPSERT_HEAT, [(*key, *v) for key, v in heat.items()])
    db.executemany(_UPSERT_LOAD, [(t, service, w, r) for (t, service), (w, r) in load.items()])


def _spread(load: dict, service: int, a_us: int, b_us: int, which: int) -> None:
    """Adds the seconds of [a_us, b_us) to the 10 s steps they fall in."""
    while a_us < b_us:
        t = a_us // STEP_US
        end = min(b_us, (t + 1) * STEP_US)
        load[(t, service)][which] += (end - a_us) / 1e6
        a_us = end


def heatmap(db: sqlite3.Connection, metric: str, start_us: int, end_us: int, service_id: int | None,
            columns: int = MAX_COLUMNS, fit: bool = False) -> dict:
    """The window [start_us, end_us] (its 10 s steps) in at most `columns` columns of whole steps:
    {"start", "end": the window as asked, "start_us": where column 0 begins, "step_us": a column's width,
    "columns", "cells": [[column, bucket,
    requests, failed, aborted, preempted]], "load": [[column, mean waiting, mean running]], "requests",
    "no_value": requests without the figure}. `service_id` None: every service. `fit`: the columns span
    only the steps that hold requests (a window open at either end)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    t0, t1 = start_us // STEP_US, end_us // STEP_US
    service, service_args = ("", []) if service_id is None else (" AND service_id = ?", [service_id])
    if fit:
        first, last = db.execute(f"SELECT min(t), max(t) FROM request_heat WHERE metric = 1 AND t BETWEEN ? AND ?"
                                 f"{service}", [t0, t1] + service_args).fetchone()
        t0, t1 = (t0, t0) if first is None else (first, last)
    per = max(1, math.ceil((t1 - t0 + 1) / max(1, columns)))  # steps per column
    where, args = "t BETWEEN ? AND ?" + service, [t0, t1] + service_args
    cells = db.execute(f"SELECT (t - ?) / ? AS x, bucket, sum(requests), sum(failed), sum(aborted), sum(preempted) "
                       f"FROM request_heat WHERE metric = ? AND {where} GROUP BY x, bucket ORDER BY x, bucket",
                       [t0, per, METRICS.index(metric)] + args).fetchall()
    load = db.execute(f"SELECT (t - ?) / ? AS x, sum(waiting_s), sum(running_s) FROM request_load WHERE {where} "
                      f"GROUP BY x ORDER BY x", [t0, per] + args).fetchall()

    def width_s(x: int) -> float:  # the column's seconds within the window's steps (the last may have fewer)
        return (min(per, t1 - t0 - x * per + 1)) * STEP_US / 1e6
    return {"metric": metric, "start": start_us, "end": end_us, "start_us": t0 * STEP_US, "step_us": per * STEP_US,
            "columns": (t1 - t0) // per + 1, "per_decade": PER_DECADE, "no_value_bucket": NO_VALUE,
            "cells": [list(c) for c in cells],
            "load": [[x, round(w / width_s(x), 3), round(r / width_s(x), 3)] for x, w, r in load],
            "requests": sum(c[2] for c in cells), "no_value": sum(c[2] for c in cells if c[1] == NO_VALUE)}
