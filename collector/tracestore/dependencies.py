"""Service dependencies (Jaeger's System Architecture): calls from one service's span to another's,
counted as spans are stored, so a week of them is read in milliseconds.

A link is a span whose parent span belongs to another service (a gateway's client span calling a
vLLM server, a client's traceparent, one pipeline stage calling the next); it is counted once, in
the minute the child span started, by (parent service, parent span name, child service, child
span name) in ``dependency_links``. Spans arrive in any order: a child whose parent is in its own
batch or already stored is counted at once; one whose parent has not come yet waits in
``pending_links`` until it does (children usually end, and are exported, before their parents)
and is dropped after ``PENDING_S`` if it never does (a parent outside this collector's view).
Same-service parent/child pairs are not links (Jaeger's Badger store skips them too). Only
spans new to the store are counted: a span delivered again is not a second call.

A store written before this table existed gets its links from its stored spans when opened
(`backfill`, one join over the spans, once).
"""

from __future__ import annotations

import sqlite3
from collections import Counter

MINUTE_US = 60_000_000
PENDING_S = 600  # how long a child waits for its parent span to be stored

SCHEMA = """
CREATE TABLE IF NOT EXISTS dependency_links (minute INTEGER NOT NULL, parent_service INTEGER NOT NULL,
    parent_operation TEXT NOT NULL, child_service INTEGER NOT NULL, child_operation TEXT NOT NULL,
    calls INTEGER NOT NULL,
    PRIMARY KEY (minute, parent_service, parent_operation, child_service, child_operation)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pending_links (trace_id BLOB NOT NULL, parent_span_id BLOB NOT NULL,
    child_service INTEGER NOT NULL, child_operation TEXT NOT NULL, minute INTEGER NOT NULL, created_us INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS pending_parent ON pending_links (trace_id, parent_span_id);
"""
_ADD = ("INSERT INTO dependency_links VALUES (?,?,?,?,?,?) "
        "ON CONFLICT DO UPDATE SET calls = calls + excluded.calls")
_BACKFILL = ("INSERT INTO dependency_links SELECT c.start_us / 60000000, p.service_id, p.name, c.service_id, c.name, "
             "count(*) FROM spans c JOIN spans p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id "
             "WHERE c.parent_span_id IS NOT NULL AND p.service_id != c.service_id GROUP BY 1, 2, 3, 4, 5")


def create(db: sqlite3.Connection) -> None:
    """Creates the tables (inside the caller's transaction); backfills them when they are new."""
    new = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'dependency_links'").fetchone() is None
    for statement in filter(str.strip, SCHEMA.split(";")):
        db.execute(statement)
    if new:
        db.execute(_BACKFILL)


def record(db: sqlite3.Connection, rows: list[tuple], inserted: set[int], now_us: int) -> None:
    """Counts the links of a batch just inserted (`rows`: the store's span rows, in the writer's
    transaction; `inserted`: the ids that were new): what its new spans complete, as children or as
    parents of waiting children."""
    if not rows:
        return
    first = rows[0][0]
    calls: Counter = Counter()
    # waiting children whose parent is in this batch
    done = []
    for rowid, child_service, child_op, minute, parent_service, parent_op in db.execute(
            "SELECT pd.rowid, pd.child_service, pd.child_operation, pd.minute, s.service_id, s.name FROM pending_links pd "
            "JOIN spans s ON s.trace_id = pd.trace_id AND s.span_id = pd.parent_span_id WHERE s.id >= ?", (first,)):
        done.append((rowid,))
        if parent_service != child_service:
            calls[(minute, parent_service, parent_op, child_service, child_op)] += 1
    if done:
        db.executemany("DELETE FROM pending_links WHERE rowid = ?", done)
    # this batch's children: parent in the batch, already stored, or not yet here
    here = {(r[1], r[2]): (r[4], r[7]) for r in rows}  # (trace_id, span_id) -> (service, name)
    waiting = []
    for row_id, trace_id, _, parent, service, _, _, name, _, start_us, *_ in rows:
        if parent is None or row_id not in inserted:
            continue
        found = here.get((trace_id, parent)) or db.execute(
            "SELECT service_id, name FROM spans WHERE trace_id = ? AND span_id = ?", (trace_id, parent)).fetchone()
        if found is None:
            waiting.append((trace_id, parent, service, name, start_us // MINUTE_US, now_us))
        elif found[0] != service:
            calls[(start_us // MINUTE_US, found[0], found[1], service, name)] += 1
    if waiting:
        db.executemany("INSERT INTO pending_links VALUES (?,?,?,?,?,?)", waiting)
    if calls:
        db.executemany(_ADD, [(*key, n) for key, n in calls.items()])


def expire(db: sqlite3.Connection, cutoff_us: int, now_us: int) -> None:
    """Drops links of minutes before the retention cutoff, and children waiting since before
    ``now_us - PENDING_S`` (both wall-clock µs)."""
    db.execute("DELETE FROM dependency_links WHERE minute < ?", (cutoff_us // MINUTE_US,))
    db.execute("DELETE FROM pending_links WHERE created_us < ?", (now_us - PENDING_S * 1_000_000,))


def links(db: sqlite3.Connection, start_us: int, end_us: int, service: str = "") -> list[tuple[str, str, int]]:
    """(parent service, child service, calls) of the minutes [start, end] overlaps, most calls first
    (``service``: only links from or to it)."""
    sql = ("SELECT ps.name, cs.name, sum(l.calls) FROM dependency_links l JOIN services ps ON ps.id = l.parent_service "
           "JOIN services cs ON cs.id = l.child_service WHERE l.minute BETWEEN ? AND ?")
    args: list = [start_us // MINUTE_US, end_us // MINUTE_US]
    if service:
        sql, args = sql + " AND (ps.name = ? OR cs.name = ?)", args + [service, service]
    return [tuple(r) for r in db.execute(sql + " GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2", args)]
