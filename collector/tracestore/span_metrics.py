"""Request rate, errors and latency per service and operation (Jaeger's Service Performance
Monitoring), counted from the spans as they are stored, so the Monitor tab needs no Prometheus.

Per minute and (service, span name, span kind): the spans that started in it, how many ended in
error (status ERROR), and a histogram of their durations (``BOUNDS_MS``: 1.2x apart from 0.05 ms to
2 hours, so a quantile read from it is within 10 % of the true one), in ``span_minutes``, written
in the writer's transaction (`record`, only spans new to the store). `series` reads them as
Jaeger's metrics reader answers: points every ``step`` from ``end - lookback`` to ``end``, each over
the ``rate_per`` window before it (to the minute): calls per second, errors as a fraction of calls,
or the q-quantile of the durations in milliseconds (interpolated within its bucket, as Prometheus's
histogram_quantile does). A window without calls has no latency or error point and a call rate of 0.
A store from before this table counts its stored spans once when opened (`backfill`).
"""

from __future__ import annotations

import math
import sqlite3
from collections import defaultdict

import numpy as np

MINUTE_US = 60_000_000
BOUNDS_MS = tuple(0.05 * 1.2**i for i in range(int(math.log(7_200_000 / 0.05, 1.2)) + 2))
_BOUNDS = np.asarray(BOUNDS_MS)

SCHEMA = """
CREATE TABLE IF NOT EXISTS span_minutes (minute INTEGER NOT NULL, service_id INTEGER NOT NULL, name TEXT NOT NULL,
    kind INTEGER NOT NULL, calls INTEGER NOT NULL, errors INTEGER NOT NULL, buckets BLOB NOT NULL,
    PRIMARY KEY (service_id, kind, minute, name)) WITHOUT ROWID;
"""


def create(db: sqlite3.Connection) -> None:
    """Creates the table (inside the caller's transaction); fills it from the stored spans when new."""
    new = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'span_minutes'").fetchone() is None
    db.execute(SCHEMA)
    if new:
        rows = db.execute("SELECT id, service_id, name, kind, start_us, duration_us, status_code FROM spans")
        while chunk := rows.fetchmany(100_000):
            _add(db, chunk)


def record(db: sqlite3.Connection, rows: list[tuple], inserted: set[int]) -> None:
    """Counts a batch just inserted (`rows`: the store's span rows; `inserted`: the ids that were new)."""
    _add(db, [(r[0], r[4], r[7], r[8], r[9], r[10], r[11]) for r in rows if r[0] in inserted])


def _add(db: sqlite3.Connection, spans: list[tuple]) -> None:
    """spans: (id, service_id, name, kind, start_us, duration_us, status_code)."""
    if not spans:
        return
    _, services, names, kinds, starts, durations, statuses = zip(*spans)
    minutes = np.asarray(starts, np.int64) // MINUTE_US
    buckets = np.searchsorted(_BOUNDS, np.asarray(durations, np.float64) / 1000.0)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, key in enumerate(zip(services, kinds, minutes.tolist(), names)):
        groups[key].append(i)
    errors = np.asarray(statuses) == 2
    out = []
    for key, idx in groups.items():
        counts = np.bincount(buckets[idx], minlength=len(BOUNDS_MS) + 1)
        calls, failed = len(idx), int(errors[idx].sum())
        old = db.execute("SELECT calls, errors, buckets FROM span_minutes WHERE service_id = ? AND kind = ? AND "
                         "minute = ? AND name = ?", key).fetchone()
        if old is not None:
            calls, failed, counts = calls + old[0], failed + old[1], counts + _decode(old[2])
        out.append((key[2], key[0], key[3], key[1], calls, failed, _encode(counts)))
    db.executemany("INSERT OR REPLACE INTO span_minutes VALUES (?,?,?,?,?,?,?)", out)


def _encode(counts: np.ndarray) -> bytes:
    """Sparse: the non-zero buckets' indexes (uint16) then their counts (uint32)."""
    nz = np.flatnonzero(counts)
    return nz.astype("<u2").tobytes() + counts[nz].astype("<u4").tobytes()


def _decode(blob: bytes) -> np.ndarray:
    n = len(blob) // 6
    counts = np.zeros(len(BOUNDS_MS) + 1, np.int64)
    counts[np.frombuffer(blob[:2 * n], "<u2")] = np.frombuffer(blob[2 * n:], "<u4")
    return counts


def expire(db: sqlite3.Connection, cutoff_us: int) -> None:
    db.execute("DELETE FROM span_minutes WHERE minute < ?", (cutoff_us // MINUTE_US,))


def series(db: sqlite3.Connection, metric: str, services: list[str], kinds: list[int], by_operation: bool,
           end_us: int, lookback_us: int, step_us: int, rate_per_us: int,
           quantile: float = 0.5) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """{(service, operation or ""): [(timestamp µs, value)]} of ``metric`` (latencies|calls|errors)."""
    first, last = (end_us - lookback_us - rate_per_us) // MINUTE_US, end_us // MINUTE_US
    sql = (f"SELECT s.name, m.name, m.minute, m.calls, m.errors, m.buckets FROM span_minutes m JOIN services s ON "
           f"s.id = m.service_id WHERE s.name IN ({','.join('?' * len(services))}) "
           f"AND m.kind IN ({','.join('?' * len(kinds))}) AND m.minute BETWEEN ? AND ?")
    width = len(BOUNDS_MS) + 1
    # per series, per minute from `first` (row 0 stays 0: the running sums below start there)
    sums: dict[tuple[str, str], np.ndarray] = {}
    for service, name, minute, calls, errors, blob in db.execute(sql, [*services, *kinds, first, last]):
        key = (service, name if by_operation else "")
        acc = sums.get(key)
        if acc is None:
            acc = sums[key] = np.zeros((last - first + 2, 2 + (width if metric == "latencies" else 0)), np.int64)
        row = acc[minute - first + 1]
        row[0] += calls
        row[1] += errors
        if metric == "latencies":
            row[2:] += _decode(blob)
    times = np.arange(end_us - lookback_us, end_us + 1, step_us, dtype=np.int64) if step_us > 0 else \
        np.array([end_us], np.int64)
    hi = np.clip(times // MINUTE_US - first + 1, 0, last - first + 1)  # the window: minutes (t - rate, t]
    lo = np.clip((times - rate_per_us) // MINUTE_US - first + 1, 0, last - first + 1)
    out = {}
    for key, acc in sums.items():
        running = np.cumsum(acc, axis=0)
        window = running[hi] - running[lo]
        calls = window[:, 0]
        if metric == "calls":
            values = calls / (rate_per_us / 1e6)
            out[key] = list(zip(times.tolist(), values.tolist()))
        elif metric == "errors":
            out[key] = [(t, e / c) for t, c, e in zip(times.tolist(), calls.tolist(), window[:, 1].tolist()) if c]
        else:
            out[key] = [(t, quantile_ms(window[i, 2:], quantile)) for i, t in enumerate(times.tolist()) if calls[i]]
    return out


def quantile_ms(counts: np.ndarray, q: float) -> float:
    """The q-quantile of a BOUNDS_MS histogram, linear within its bucket (histogram_quantile's rule)."""
    cumulative = np.cumsum(counts)
    rank = q * cumulative[-1]
    i = int(np.searchsorted(cumulative, rank))
    if i >= len(BOUNDS_MS):
        return BOUNDS_MS[-1]
    lower = BOUNDS_MS[i - 1] if i > 0 else 0.0
    below = cumulative[i - 1] if i > 0 else 0
    return lower + (BOUNDS_MS[i] - lower) * (rank - below) / max(1, counts[i])
