"""Where an `ExporterQueue` keeps its items: in memory, or on disk so they survive a restart.

Both keep items in arrival order and hand out the oldest first: `take` removes a batch from
the waiting ones (the first item, then the items behind it while their records stay within
``max_records``), `done` forgets a batch for good once it was sent or dropped. What was
taken and is not done yet is in flight.

`SqliteStorage` (SQLite in WAL mode, the role of the OpenTelemetry Collector's
``file_storage`` sending queue) commits every `put` before it returns, so an item a
receiver acknowledged survives ``kill -9``; a batch leaves the file only in `done`, so one
that was in flight when the process died is sent again after the restart (at least once:
its backend may see it twice; the records of such batches are counted in `resent_records`).
Items must be bytes.

Not thread-safe: the queue calls every method under its own lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import re
import sqlite3
from collections import deque
from pathlib import Path
from typing import NamedTuple

from otel_llm.export.redaction import redact_url

logger = logging.getLogger(__name__)


class Taken(NamedTuple):
    items: list  # oldest first
    records: int
    key: object  # what `done` forgets


class MemoryStorage:
    persistent = False
    resent_records = 0

    def __init__(self) -> None:
        self._items: deque[tuple[object, int, int]] = deque()  # (item, records, bytes)
        self.count = self.bytes = 0  # waiting items and their size

    def put(self, item: object, records: int, size: int) -> None:
        self._items.append((item, records, size))
        self.count += 1
        self.bytes += size

    def take(self, max_records: int | None) -> Taken | None:
        """The oldest waiting item and, with ``max_records``, those behind it that fit; None if empty."""
        if not self._items:
            return None
        items, records = [], 0
        while self._items and _joins(items, records, self._items[0][1], max_records):
            item, n, size = self._items.popleft()
            items.append(item)
            records += n
            self.count -= 1
            self.bytes -= size
        return Taken(items, records, None)

    def done(self, key: object) -> None:
        pass

    def clear(self) -> int:
        """At shutdown: forget what waits; returns its records (dropped)."""
        records = sum(n for _, n, _ in self._items)
        self._items.clear()
        self.count = self.bytes = 0
        return records

    def close(self) -> None:
        pass


class SqliteStorage:
    persistent = True

    def __init__(self, path: Path) -> None:
        """Raises OSError when the file cannot be made or another process has it open."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock_file = open(path.with_suffix(".lock"), "w")  # released by the OS when the process dies
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise OSError(f"{path} is in use by another process (another collector with the same "
                          "--storage-dir?)") from None
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)  # autocommit
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a commit survives the process (not a power cut)
        self._db.execute("CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY AUTOINCREMENT, records INTEGER NOT NULL, "
                         "size INTEGER NOT NULL, body BLOB NOT NULL, taken INTEGER NOT NULL DEFAULT 0)")
        count, size, records, resent = self._db.execute(
            "SELECT count(*), coalesce(sum(size), 0), coalesce(sum(records), 0), "
            "coalesce(sum(records * taken), 0) FROM items").fetchone()
        self.count, self.bytes, self.recovered_records = count, size, records
        self.resent_records = resent  # in flight when the last run ended: its backend may get them twice
        self._next_id = 0  # items with a smaller id are taken (in flight) or done
        if count:
            logger.info("%s: %d requests (%d records) left by the last run will be sent; %d records were in "
                        "flight when it ended and may reach the backend twice", path, count, records, resent)

    def put(self, item: bytes, records: int, size: int) -> None:
        self._db.execute("INSERT INTO items (records, size, body) VALUES (?, ?, ?)", (records, size, item))
        self.count += 1
        self.bytes += size

    def take(self, max_records: int | None) -> Taken | None:
        rows = self._db.execute("SELECT id, records, size, body FROM items WHERE id >= ? ORDER BY id LIMIT ?",
                                (self._next_id, 1 if max_records is None else 256)).fetchall()
        items, records, last = [], 0, None
        for row_id, n, size, body in rows:
            if not _joins(items, records, n, max_records):
                break
            items.append(body)
            records += n
            last = row_id
            self.count -= 1
            self.bytes -= size
        if last is None:
            return None
        first, self._next_id = self._next_id, last + 1
        self._db.execute("UPDATE items SET taken = 1 WHERE id BETWEEN ? AND ?", (first, last))
        return Taken(items, records, (first, last))

    def done(self, key: tuple[int, int]) -> None:
        self._db.execute("DELETE FROM items WHERE id BETWEEN ? AND ?", key)

    def clear(self) -> int:
        """At shutdown: what waits stays in the file for the next start; nothing is dropped."""
        if self.count:
            logger.info("%s: %d requests kept for the next start", self.path, self.count)
        return 0

    def close(self) -> None:
        self._db.close()
        self._lock_file.close()


def _joins(taken: list, records: int, n: int, max_records: int | None) -> bool:
    """Whether the next item (``n`` records) joins a batch: the first always does; others while
    the batch stays within ``max_records`` (None: one item per batch)."""
    return not taken or (max_records is not None and records + n <= max_records)


def storage_path(directory: Path, kind: str, endpoint: str) -> Path:
    """One file per backend, named after its endpoint (so reordering flags never swaps queues)."""
    readable = re.sub(r"[^A-Za-z0-9]+", "_", redact_url(endpoint)).strip("_")[:60]
    return directory / f"{kind}-{readable}-{hashlib.sha1(endpoint.encode()).hexdigest()[:8]}.sqlite"
