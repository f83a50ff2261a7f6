"""The trace store's SQLite schema, and bringing a database an earlier version wrote up to it.

Tables: ``services``, ``resources`` and ``scopes`` deduplicated (protobuf bytes); ``operations``
(service, name, kind); ``spans``, one row per (trace_id, span_id), kept unique by the
``spans_span`` index, which also serves trace lookup; ``requests``, one row per request span
(``gen_ai.latency.*`` attributes; mean ITL, preemption, model, instance, LoRA adapter and prompt
tokens since the fleet overview, NULL and 0 in the rows of an older database), sharing its span's
row id, indexed by start with the latencies (``requests_window``); the service dependency counts
(`dependencies`), the per-minute span counts of Service Performance Monitoring (`span_metrics`) and
the requests' latency heatmap and load per 10 s (`request_heat`).

Databases written before ``spans_span`` existed kept every delivery of a span: a trace resent by
an OTLP client or an exporter's on-disk queue (at least once, by design) showed its spans as
often as they came. `create_or_upgrade` finds such a database by its missing index and,
in one transaction, deletes each span's later copies (and their request rows), keeping the first
stored, then creates the index: once, at open (3.7 s for a million spans on 2 cores).
"""

from __future__ import annotations

import sqlite3

from otel_llm.collector.tracestore import dependencies, request_heat, span_metrics

SCHEMA = """
CREATE TABLE IF NOT EXISTS services (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS resources (id INTEGER PRIMARY KEY, service_id INTEGER NOT NULL, body BLOB NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS scopes (id INTEGER PRIMARY KEY, body BLOB NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS operations (service_id INTEGER NOT NULL, name TEXT NOT NULL, kind INTEGER NOT NULL,
    PRIMARY KEY (service_id, name, kind)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS spans (id INTEGER PRIMARY KEY, trace_id BLOB NOT NULL, span_id BLOB NOT NULL,
    parent_span_id BLOB, service_id INTEGER NOT NULL, resource_id INTEGER NOT NULL, scope_id INTEGER NOT NULL,
    name TEXT NOT NULL, kind INTEGER NOT NULL, start_us INTEGER NOT NULL, duration_us INTEGER NOT NULL,
    status_code INTEGER NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS spans_service ON spans (service_id, start_us);
CREATE INDEX IF NOT EXISTS spans_operation ON spans (service_id, name, start_us);
CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, trace_id BLOB NOT NULL, span_id BLOB NOT NULL,
    service_id INTEGER NOT NULL, operation TEXT NOT NULL, start_us INTEGER NOT NULL, duration_us INTEGER NOT NULL,
    ttft_s REAL, e2e_s REAL, queue_s REAL, error INTEGER NOT NULL, error_type TEXT, finish_reason TEXT, itl_s REAL,
    preempted INTEGER NOT NULL DEFAULT 0, model TEXT, instance TEXT, lora TEXT, prompt_tokens INTEGER);
CREATE INDEX IF NOT EXISTS requests_failed ON requests (start_us) WHERE error = 1;
"""
_UNIQUE_SPANS = "CREATE UNIQUE INDEX spans_span ON spans (trace_id, span_id)"
_ADDED_REQUEST_COLUMNS = (("itl_s", "REAL"), ("preempted", "INTEGER NOT NULL DEFAULT 0"), ("model", "TEXT"),
                          ("instance", "TEXT"), ("lora", "TEXT"), ("prompt_tokens", "INTEGER"))
# a window's requests by start with their latencies and error flag: what the fleet overview's drill-down reads,
# without the table (it replaced the index on start_us alone)
_REQUESTS_WINDOW = "CREATE INDEX IF NOT EXISTS requests_window ON requests (start_us, ttft_s, e2e_s, queue_s, itl_s, error)"

INSERT_SPAN = "INSERT OR IGNORE INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
"""A span already stored (same trace_id and span_id) is ignored: the first delivery stays."""
INSERT_REQUEST = ("INSERT INTO requests SELECT ?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19 "
                  "WHERE EXISTS (SELECT 1 FROM spans WHERE id = ?1)")
"""A request row only beside the span row of the same id, so not for an ignored later delivery."""


def create_or_upgrade(db: sqlite3.Connection) -> int:
    """Creates what is missing of the schema on ``db`` (autocommit mode, no transaction open);
    in a database from before ``spans_span`` first deletes every span's later copies and the
    request rows left without their span. Returns how many span rows were deleted (0 when the
    database is new or current). Raises sqlite3.Error (nothing changed) when it cannot."""
    db.execute("BEGIN IMMEDIATE")
    try:  # executescript would COMMIT at once: the statements go one by one, in the transaction
        for statement in filter(str.strip, SCHEMA.split(";")):
            db.execute(statement)
        columns = {row[1] for row in db.execute("PRAGMA table_info(requests)")}
        for column, declared in _ADDED_REQUEST_COLUMNS:  # a database from before them: NULL, 0 in its rows
            if column not in columns:
                db.execute(f"ALTER TABLE requests ADD COLUMN {column} {declared}")
        db.execute(_REQUESTS_WINDOW)
        db.execute("DROP INDEX IF EXISTS requests_start")
        dependencies.create(db)
        span_metrics.create(db)
        request_heat.create(db)
        deleted = 0
        if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'spans_span'").fetchone() is None:
            deleted = db.execute("DELETE FROM spans WHERE EXISTS (SELECT 1 FROM spans kept WHERE kept.trace_id = "
                                 "spans.trace_id AND kept.span_id = spans.span_id AND kept.id < spans.id)").rowcount
            db.execute("DELETE FROM requests WHERE NOT EXISTS (SELECT 1 FROM spans WHERE spans.id = requests.id)")
            db.execute(_UNIQUE_SPANS)
            db.execute("DROP INDEX IF EXISTS spans_trace")  # the unique index's prefix serves trace lookup
        db.execute("COMMIT")
        return deleted
    except BaseException:
        db.execute("ROLLBACK")
        raise
