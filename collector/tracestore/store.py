"""The collector's trace store (``--trace-store DIR``): spans in one SQLite file, indexed for
trace lookup, Jaeger-style search and the LLM questions (slowest requests, failed requests).

Layout (``DIR/traces.sqlite``, WAL, synchronous=NORMAL; the schema in `schema`): one ``spans``
row per (trace_id, span_id) (ids, service, name, kind, start/duration in µs, status code, and
``body`` = the span's protobuf with ids and name cleared); ``resources`` and ``scopes``
deduplicated (protobuf bytes); ``operations`` (service, name, kind) for the service/operation
lists; one ``requests`` row per span carrying ``gen_ai.latency.*`` attributes (TTFT, e2e, queue
time in seconds, error flag, finish reason), sharing the span's row id; calls between services
(`dependencies`), calls, errors and durations per service and operation (`span_metrics`) counted
per minute, and the requests' latency heatmap and load (`request_heat`) per 10 s, as spans come. OTLP delivery is at
least once (clients and the exporters' queues resend): a span that comes again, in the same
batch or later, is the same span, and the first stored stays.

Threads: `add` and `enforce_retention` write under one lock on one connection (one writer
thread is expected; a batch is one transaction). Queries run on pooled read-only connections
and see only committed batches, concurrently with the writer. All methods are thread-safe.

Size: one noun, the SQLite store: its writer and queries share the connections and one lock.
"""

from __future__ import annotations

import math
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_llm.collector.pdata.request_span import request_facts
from otel_llm.collector.pdata.span_ids import id_problem
from otel_llm.collector.tracestore import dependencies, drill_down, request_heat, schema, span_metrics
from otel_llm.collector.tracestore.query import (
    DERIVED_TAGS, SPAN_KINDS, Operation, RequestSummary, StoredSpan, TraceQuery, instance_id, parse_trace_id,
    service_name, span_matches,
)

_METRIC_COLUMNS = {"ttft": "ttft_s", "e2e": "e2e_s", "queue": "queue_s"}
_DELETE_CHUNK = 20_000  # rows per transaction while deleting, so the WAL stays small


@dataclass(frozen=True)
class TraceStoreConfig:
    """``retention_s``: spans that started longer ago are deleted. ``max_bytes``: bound on the
    database's used pages; over it the oldest-received spans go (the file keeps freed pages for
    reuse, so it stays near this size; the WAL, at most 64 MiB, comes on top)."""
    directory: str
    retention_s: float = 24 * 3600.0
    max_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if not isinstance(self.directory, str) or not self.directory:
            raise ValueError(f"trace store directory must be a non-empty path, got {self.directory!r}")
        if not (isinstance(self.retention_s, (int, float)) and math.isfinite(self.retention_s) and self.retention_s > 0):
            raise ValueError(f"trace store retention_s must be a positive number of seconds, got {self.retention_s!r}")
        if not isinstance(self.max_bytes, int) or self.max_bytes < (1 << 20):
            raise ValueError(f"trace store max_bytes must be an integer >= 1 MiB (1048576), got {self.max_bytes!r}")


class TraceStore:
    def __init__(self, config: TraceStoreConfig) -> None:
        """Opens (or creates) ``config.directory``/traces.sqlite; raises OSError/sqlite3.Error if it cannot."""
        Path(config.directory).mkdir(parents=True, exist_ok=True)
        self.config, self.path = config, Path(config.directory).absolute() / "traces.sqlite"
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=10000", f"journal_size_limit={64 << 20}"):
            self._db.execute(f"PRAGMA {pragma}")
        schema.create_or_upgrade(self._db)
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._closed = False
        self._parsed: dict[tuple[str, int], Resource | InstrumentationScope] = {}  # read side, by (table, id)
        self._load_writer_state()

    def _load_writer_state(self) -> None:
        db = self._db
        self._services = dict(db.execute("SELECT name, id FROM services"))
        self._resources = {body: (rid, sid) for rid, sid, body in db.execute("SELECT id, service_id, body FROM resources")}
        self._scopes = {body: sid for sid, body in db.execute("SELECT id, body FROM scopes")}
        self._operations = set(db.execute("SELECT service_id, name, kind FROM operations"))
        self._next_id = 1 + db.execute("SELECT max(coalesce((SELECT max(id) FROM spans), 0), "
                                       "coalesce((SELECT max(id) FROM requests), 0))").fetchone()[0]

    # -- writing -----------------------------------------------------------------------------

    def add(self, request_bytes: bytes) -> int:
        """Stores every span of a serialized ExportTraceServiceRequest in one transaction;
        returns how many were new (one already stored, same trace_id and span_id, is skipped).
        Raises ValueError (nothing stored) when it is malformed."""
        try:
            request = ExportTraceServiceRequest.FromString(request_bytes)
        except (DecodeError, RecursionError) as exc:
            raise ValueError(f"malformed protobuf ExportTraceServiceRequest: {exc}") from None
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    problem = id_problem(span)
                    if problem:
                        raise ValueError(f"span {span.name[:100]!r}: {problem} (trace_id {span.trace_id[:32].hex()!r}, "
                                         f"span_id {span.span_id[:32].hex()!r})")
        with self._lock:
            if self._closed:
                raise RuntimeError("TraceStore is closed")
            self._db.execute("BEGIN")
            try:
                spans, requests = self._rows(request)
                stored = self._db.executemany(schema.INSERT_SPAN, spans).rowcount
                self._db.executemany(schema.INSERT_REQUEST, requests)
                if spans:
                    inserted = {i for (i,) in self._db.execute("SELECT id FROM spans WHERE id BETWEEN ? AND ?",
                                                               (spans[0][0], spans[-1][0]))}
                    dependencies.record(self._db, spans, inserted, time.time_ns() // 1000)
                    span_metrics.record(self._db, spans, inserted)
                    request_heat.record(self._db, requests, inserted)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._load_writer_state()
                raise
            return stored

    def _rows(self, request: ExportTraceServiceRequest) -> tuple[list[tuple], list[tuple]]:
        spans, requests, row = [], [], self._next_id
        for rs in request.resource_spans:
            resource_id, service_id = self._resource_id(rs.resource)
            instance = instance_id(rs.resource)
            for ss in rs.scope_spans:
                scope_id = self._scope_id(ss.scope)
                for span in ss.spans:
                    trace_id, span_id, name, kind = span.trace_id, span.span_id, span.name, span.kind
                    start_us, duration_us = span.start_time_unix_nano // 1000, \
                        max(0, span.end_time_unix_nano - span.start_time_unix_nano) // 1000
                    if (service_id, name, kind) not in self._operations:
                        self._db.execute("INSERT OR IGNORE INTO operations VALUES (?,?,?)", (service_id, name, kind))
                        self._operations.add((service_id, name, kind))
                    request_row = _request_row(span, instance)
                    if request_row is not None:
                        requests.append((row, trace_id, span_id, service_id, name, start_us, duration_us) + request_row)
                    parent = span.parent_span_id or None
                    for f in ("trace_id", "span_id", "parent_span_id", "name"):
                        span.ClearField(f)
                    spans.append((row, trace_id, span_id, parent, service_id, resource_id, scope_id, name, kind,
                                  start_us, duration_us, span.status.code, span.SerializeToString()))
                    row += 1
        self._next_id = row
        return spans, requests

    def _resource_id(self, resource: Resource) -> tuple[int, int]:
        body = resource.SerializeToString(deterministic=True)
        ids = self._resources.get(body)
        if ids is None:
            name = service_name(resource)
            service_id = self._services.get(name)
            if service_id is None:
                service_id = self._services[name] = self._db.execute(
                    "INSERT INTO services (name) VALUES (?)", (name,)).lastrowid
            rid = self._db.execute("INSERT INTO resources (service_id, body) VALUES (?, ?)", (service_id, body)).lastrowid
            ids = self._resources[body] = (rid, service_id)
        return ids

    def _scope_id(self, scope: InstrumentationScope) -> int:
        body = scope.SerializeToString(deterministic=True)
        sid = self._scopes.get(body)
        if sid is None:
            sid = self._scopes[body] = self._db.execute("INSERT INTO scopes (body) VALUES (?)", (body,)).lastrowid
        return sid

    def enforce_retention(self, now_us: int | None = None) -> int:
        """Deletes spans that started before ``now_us - retention_s`` and then, while the used
        size exceeds ``max_bytes``, the oldest received; returns how many spans went. Cheap
        when there is nothing to delete (index range probes and two pragmas)."""
        now_us = time.time_ns() // 1000 if now_us is None else now_us
        cutoff = now_us - int(self.config.retention_s * 1e6)
        deleted = 0
        with self._lock:
            if self._closed:
                raise RuntimeError("TraceStore is closed")
            for service_id in self._services.values():
                deleted += self._delete("SELECT id FROM spans WHERE service_id = ? AND start_us < ?", (service_id, cutoff))
            self._delete("SELECT id FROM requests WHERE start_us < ?", (cutoff,), table="requests")
            dependencies.expire(self._db, cutoff, time.time_ns() // 1000)  # (waiting since: the wall clock)
            span_metrics.expire(self._db, cutoff)
            request_heat.expire(self._db, cutoff)
            trimmed = False
            for _ in range(20):
                used = self._used_bytes()
                if used <= self.config.max_bytes:
                    break
                lo, hi = self._db.execute("SELECT (SELECT min(id) FROM spans), (SELECT max(id) FROM spans)").fetchone()
                if lo is None:
                    break
                bound = lo + max(1, math.ceil((hi - lo + 1) * (used - 0.9 * self.config.max_bytes) / used))
                deleted += self._delete("SELECT id FROM spans WHERE id < ?", (bound,))
                self._delete("SELECT id FROM requests WHERE id < ?", (bound,), table="requests")
                trimmed = True
            if trimmed:  # the overview starts where the oldest request kept does
                oldest = self._db.execute("SELECT min(start_us) FROM requests").fetchone()[0]
                request_heat.expire(self._db, (1 << 62) if oldest is None else oldest)
            if deleted:
                self._db.execute("DELETE FROM operations WHERE NOT EXISTS (SELECT 1 FROM spans s WHERE s.service_id = "
                                 "operations.service_id AND s.name = operations.name AND s.kind = operations.kind)")
                self._operations = set(self._db.execute("SELECT service_id, name, kind FROM operations"))
        return deleted

    def _delete(self, select_ids: str, args: tuple, table: str = "spans") -> int:
        total = 0
        while True:
            n = self._db.execute(f"DELETE FROM {table} WHERE id IN ({select_ids} LIMIT {_DELETE_CHUNK})", args).rowcount
            total += n
            if n < _DELETE_CHUNK:
                return total

    def used_bytes(self) -> int:
        """(page_count - freelist_count) x page_size of the database, what ``max_bytes`` bounds."""
        with self._lock:
            return self._used_bytes()

    def _used_bytes(self) -> int:
        db = self._db
        pages = db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
        return pages * db.execute("PRAGMA page_size").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
        self._close_idle_readers()

    # -- reading -----------------------------------------------------------------------------

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        if self._closed:
            raise RuntimeError("TraceStore is closed")
        try:
            db = self._readers.get_nowait()
        except queue.Empty:
            db = sqlite3.connect(f"{self.path.as_uri()}?mode=ro", uri=True, check_same_thread=False)
            db.execute("PRAGMA busy_timeout=10000")
        try:
            yield db
        finally:
            self._readers.put(db)
            if self._closed:  # close() may have drained the pool while this one was out
                self._close_idle_readers()

    def _close_idle_readers(self) -> None:
        while True:
            try:
                self._readers.get_nowait().close()
            except queue.Empty:
                return

    def services(self) -> list[str]:
        with self._reader() as db:
            return [name for (name,) in db.execute("SELECT DISTINCT s.name FROM operations o JOIN services s ON "
                                                   "s.id = o.service_id ORDER BY s.name")]

    def operations(self, service: str, span_kind: str | None = None) -> list[Operation]:
        """Operations (span names) of ``service``, optionally only those of one Jaeger span kind."""
        sql, args = "SELECT o.name, o.kind FROM operations o JOIN services s ON s.id = o.service_id WHERE s.name = ?", [service]
        if span_kind:
            if span_kind not in SPAN_KINDS:
                raise ValueError(f"unsupported span kind {span_kind!r}; expected one of {', '.join(SPAN_KINDS[1:])}")
            sql, args = sql + " AND o.kind = ?", args + [SPAN_KINDS.index(span_kind)]
        with self._reader() as db:
            return [Operation(name, SPAN_KINDS[kind] if 0 <= kind < len(SPAN_KINDS) else "")
                    for name, kind in db.execute(sql + " ORDER BY o.name, o.kind", args)]

    def find_traces(self, query: TraceQuery) -> list[list[StoredSpan]]:
        """Whole traces matching ``query`` (see TraceQuery), newest matching span first."""
        sql = "SELECT trace_id, resource_id, scope_id, name, body FROM spans WHERE service_id = ?"
        args: list = []
        if query.operation:
            sql, args = sql + " AND name = ?", [query.operation]
        sql += " AND start_us BETWEEN ? AND ? AND duration_us >= ?"
        args += [query.start_us, query.end_us, query.min_duration_us]
        if query.max_duration_us is not None:
            sql, args = sql + " AND duration_us <= ?", args + [query.max_duration_us]
        found: dict[bytes, None] = {}
        with self._reader() as db:
            row = db.execute("SELECT id FROM services WHERE name = ?", (query.service,)).fetchone()
            if row is None:
                return []
            # an attribute's key is in the span's protobuf bytes or its resource's: a cheap test first
            keys = [(k, k.encode()) for k in query.tags if k not in DERIVED_TAGS]
            for trace_id, resource_id, scope_id, name, body in db.execute(sql + " ORDER BY start_us DESC", [row[0]] + args):
                if trace_id in found:
                    continue
                if query.tags:
                    resource = self._parsed_row(db, "resources", resource_id, Resource)
                    if any(raw not in body and all(kv.key != k for kv in resource.attributes) for k, raw in keys) \
                            or not span_matches(query.tags, self._span(db, trace_id, b"", None, resource_id, scope_id, name, body)):
                        continue
                found[trace_id] = None
                if len(found) == query.limit:
                    break
            return [self._trace(db, trace_id) for trace_id in found]

    def dependencies(self, start_us: int, end_us: int, service: str = "") -> list[tuple[str, str, int]]:
        """(parent service, child service, calls) of spans that started in [start_us, end_us], to the minute."""
        with self._reader() as db:
            return dependencies.links(db, start_us, end_us, service)

    def span_series(self, metric: str, services: list[str], kinds: list[int], by_operation: bool, end_us: int,
                    lookback_us: int, step_us: int, rate_per_us: int, quantile: float = 0.5) -> dict:
        """Calls, errors or latency per service (and operation) over time: `span_metrics.series`."""
        with self._reader() as db:
            return span_metrics.series(db, metric, services, kinds, by_operation, end_us, lookback_us, step_us,
                                       rate_per_us, quantile)

    def heatmap(self, metric: str, start_us: int, end_us: int, service: str = "",
                columns: int = request_heat.MAX_COLUMNS, fit: bool = False) -> dict:
        """Every request that started in [start_us, end_us] (of `service`, or all) as a latency heatmap
        and load lane: `request_heat.heatmap`. ValueError on an unknown metric."""
        with self._reader() as db:
            return request_heat.heatmap(db, metric, start_us, end_us, _service_id(db, service), columns, fit)

    def choose_requests(self, start_us: int, end_us: int, limit: int, metric: str | None = None,
                        low_s: float | None = None, high_s: float | None = None,
                        service: str = "") -> tuple[int, list[list[StoredSpan]], str]:
        """(requests in the region, the traces of those chosen to list, how they were chosen):
        `drill_down.choose`. ValueError on a bad region or limit."""
        if limit <= 0:
            raise ValueError(f"limit must be greater than 0, got {limit!r}")
        with self._reader() as db:
            region = self._region(db, start_us, end_us, metric, low_s, high_s, service)
            matched, ids, chosen = drill_down.choose(db, region, limit)
            return matched, [self._trace(db, trace_id) for trace_id in ids], chosen

    def compare_requests(self, start_us: int, end_us: int, metric: str | None = None, low_s: float | None = None,
                         high_s: float | None = None, service: str = "") -> list[dict]:
        """What sets the region's requests apart from the rest of its time range: `drill_down.compare`."""
        with self._reader() as db:
            return drill_down.compare(db, self._region(db, start_us, end_us, metric, low_s, high_s, service))

    @staticmethod
    def _region(db, start_us, end_us, metric, low_s, high_s, service) -> drill_down.Region:
        return drill_down.Region(start_us, end_us, metric or None, low_s, high_s, _service_id(db, service))

    def trace(self, trace_id_hex: str) -> list[StoredSpan]:
        """The spans of one trace by start time ([] when unknown); ValueError on a bad id."""
        trace_id = parse_trace_id(trace_id_hex)
        with self._reader() as db:
            return self._trace(db, trace_id)

    def _trace(self, db: sqlite3.Connection, trace_id: bytes) -> list[StoredSpan]:
        return [self._span(db, trace_id, *row) for row in db.execute(
            "SELECT span_id, parent_span_id, resource_id, scope_id, name, body FROM spans WHERE trace_id = ? "
            "ORDER BY start_us, id", (trace_id,))]

    def _span(self, db, trace_id, span_id, parent, resource_id, scope_id, name, body) -> StoredSpan:
        span = trace_pb2.Span.FromString(body)
        span.trace_id, span.span_id, span.parent_span_id, span.name = trace_id, span_id, parent or b"", name
        return StoredSpan(span, self._parsed_row(db, "resources", resource_id, Resource),
                          self._parsed_row(db, "scopes", scope_id, InstrumentationScope))

    def _parsed_row(self, db, table: str, row_id: int, message_type):
        # rows are immutable once written, so the cache never goes stale; a race only parses twice
        parsed = self._parsed.get((table, row_id))
        if parsed is None:
            (body,) = db.execute(f"SELECT body FROM {table} WHERE id = ?", (row_id,)).fetchone()
            parsed = self._parsed[(table, row_id)] = message_type.FromString(body)
        return parsed

    def slowest_requests(self, metric: str, since_us: int, limit: int = 20) -> list[RequestSummary]:
        """Requests that started at or after ``since_us`` with the largest ``metric`` (ttft|e2e|queue)."""
        column = _METRIC_COLUMNS.get(metric)
        if column is None:
            raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(_METRIC_COLUMNS)}")
        return self._requests(f"r.start_us >= ? AND r.{column} IS NOT NULL ORDER BY r.{column} DESC", (since_us,), limit)

    def failed_requests(self, start_us: int, end_us: int, limit: int = 100) -> list[RequestSummary]:
        """Errored or aborted requests that started in [start_us, end_us], newest first."""
        return self._requests("r.error = 1 AND r.start_us BETWEEN ? AND ? ORDER BY r.start_us DESC", (start_us, end_us), limit)

    def request_traces(self, start_us: int, end_us: int, limit: int = 1000) -> list[list[StoredSpan]]:
        """The whole traces of the requests (spans with ``gen_ai.latency.*``) that started in
        [start_us, end_us], by their start, at most ``limit`` traces (the request timeline)."""
        if limit <= 0:
            raise ValueError(f"limit must be greater than 0, got {limit!r}")
        with self._reader() as db:
            ids = [row[0] for row in db.execute(
                "SELECT trace_id FROM requests WHERE start_us BETWEEN ? AND ? GROUP BY trace_id "
                "ORDER BY MIN(start_us) LIMIT ?", (start_us, end_us, limit))]
            return [self._trace(db, trace_id) for trace_id in ids]

    def spans_named(self, name: str, start_us: int, end_us: int, longest_us: int, limit: int) -> list[StoredSpan]:
        """The spans called `name`, of every service, that overlap [start_us, end_us] (those that started at
        most `longest_us` before it are looked at), by their start, at most `limit` (the engine lane's windows)."""
        if limit <= 0:
            raise ValueError(f"limit must be greater than 0, got {limit!r}")
        with self._reader() as db:
            rows = db.execute(
                "SELECT trace_id, span_id, parent_span_id, resource_id, scope_id, name, body FROM spans "
                "WHERE service_id IN (SELECT id FROM services) AND name = ? AND start_us BETWEEN ? AND ? "
                "AND start_us + duration_us >= ? ORDER BY start_us LIMIT ?",
                (name, start_us - longest_us, end_us, start_us, limit)).fetchall()
            return [self._span(db, *row) for row in rows]

    def _requests(self, where: str, args: tuple, limit: int) -> list[RequestSummary]:
        if limit <= 0:
            raise ValueError(f"limit must be greater than 0, got {limit!r}")
        sql = ("SELECT r.trace_id, r.span_id, s.name, r.operation, r.start_us, r.duration_us, r.ttft_s, r.e2e_s, "
               "r.queue_s, r.error, r.error_type, r.finish_reason FROM requests r JOIN services s ON s.id = r.service_id "
               f"WHERE {where} LIMIT ?")
        with self._reader() as db:
            return [RequestSummary(*row[:9], bool(row[9]), *row[10:]) for row in db.execute(sql, args + (limit,))]


def _service_id(db: sqlite3.Connection, service: str) -> int | None:
    """The id of service `service` (-1 for one never stored, so nothing matches); None for "" (every service)."""
    if not service:
        return None
    row = db.execute("SELECT id FROM services WHERE name = ?", (service,)).fetchone()
    return -1 if row is None else row[0]


def _request_row(span: trace_pb2.Span, instance: str) -> tuple | None:
    """(ttft_s, e2e_s, queue_s, error, error_type, finish_reason, itl_s, preempted, model, instance, lora,
    prompt_tokens) of a request span, else None."""
    facts = request_facts(span)
    if not facts.is_request:
        return None
    return (*facts[:3], int(facts.error), facts.error_type, facts.finish_reason, facts.itl_s, int(facts.preempted),
            facts.model, instance or None, facts.lora, facts.prompt_tokens)
