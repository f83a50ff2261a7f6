"""One target's scrape GETs: the whole answer within the target's timeout, at most its body limit.

A `Fetcher` keeps one HTTP/1.1 connection to its target open from one scrape to the next
(keep-alive, as Prometheus does): a GET is then a request line and an answer, without a TCP
(or TLS) handshake, urllib's handler chain or a thread. A kept connection the target closed in
between (an idle timeout) is replaced once, at once. URLs urllib treats specially take its path
as before: credentials in the URL, a proxy from the environment, and a target that answers with a
redirect (urllib follows it; from that answer on).

The timeout is one deadline for the connection, the status line, the headers and the body: when
it passes, the shared `_Watchdog` thread shuts down every socket the fetch used (a per-read
timeout, which `urlopen` has, lets a target that trickles a byte at a time hold a scrape for ever).

Thread-safety: a Fetcher belongs to its target's scrape thread; `_Deadline` and `_Watchdog` are
shared with the watchdog thread under their locks.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from otel_llm.collector.receiver.scrape_convert import ScrapeError

if TYPE_CHECKING:
    from otel_llm.collector.receiver.scrape import ScrapeTarget

ACCEPT = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
_CHUNK = 64 * 1024
_REDIRECTS = (301, 302, 303, 307, 308)  # what urllib's HTTPRedirectHandler follows


class _Deadline:
    """Every socket one fetch uses, shut down when the scrape's time is up (unless the fetch ended first)."""

    def __init__(self, timeout_s: float) -> None:
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.passed = False
        self._ended = False
        self._at = time.monotonic() + timeout_s

    def opened(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if not self.passed:
                return
        self._cut()

    def _cut(self) -> None:
        with self._lock:  # (so a fetch that ended keeps its connection whole)
            if self._ended:
                return
            self.passed = True
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # the reading thread sees the end at once
                except OSError:
                    pass

    def __enter__(self) -> _Deadline:
        _WATCHDOG.add(self._at, self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._ended = True


class _Watchdog:
    """One daemon thread for every fetch's deadline (a `threading.Timer` per scrape costs a thread
    start, ~0.1 ms CPU). Deadlines whose fetch ended are dropped when they come up."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked child starts a thread of its own

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._order = itertools.count()  # ties in time never compare deadlines
        self._thread: threading.Thread | None = None

    def add(self, at: float, deadline: _Deadline) -> None:
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._order), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="scrape deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is deadline:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2]._ended:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait_s = self._heap[0][0] - time.monotonic()
                if wait_s > 0:
                    self._cond.wait(wait_s)
                    continue
                due = heapq.heappop(self._heap)[2]
            due._cut()


_WATCHDOG = _Watchdog()


class _Connection:
    """Tells the current fetch's `_Deadline` of its socket once connected."""

    deadline: _Deadline | None = None

    def connect(self) -> None:
        super().connect()
        self.deadline.opened(self.sock)


class _HTTPConnection(_Connection, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Connection, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_connection_class(_HTTPConnection, req.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(_connection_class(_HTTPSConnection, req.deadline), req, context=self._context)


def _connection_class(cls, deadline: _Deadline):
    def make(*args, **kwargs):
        conn = cls(*args, **kwargs)
        conn.deadline = deadline
        return conn
    return make


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.deadline = req.deadline  # (the redirected request's connection is the fetch's too)
        return new


_OPENER = urllib.request.build_opener(_HTTPHandler, _HTTPSHandler, _RedirectHandler)
_PROXIES = next((h.proxies for h in _OPENER.handlers if isinstance(h, urllib.request.ProxyHandler)), {})


class Fetcher:
    """One target's GETs, over a connection kept between scrapes (only its scrape thread calls it)."""

    def __init__(self, target: ScrapeTarget) -> None:
        self.target = target
        parts = urlsplit(target.url)
        self._https = parts.scheme == "https"
        self._netloc = parts.netloc
        self._selector = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._direct = parts.username is None and not (
            parts.scheme in _PROXIES and not urllib.request.proxy_bypass(parts.hostname))
        self._headers = {"Accept": ACCEPT, "User-Agent": "otel-llm-collector",
                         "X-Prometheus-Scrape-Timeout-Seconds": f"{target.timeout_s:g}"}
        self._conn: _HTTPConnection | _HTTPSConnection | None = None
        self._response: http.client.HTTPResponse | None = None  # the current answer on `_conn`

    def fetch(self) -> tuple[str, bool]:
        """(body, is OpenMetrics) within `target.timeout_s` in all. Raises ScrapeError: unreachable,
        http_status, timeout, body_limit, malformed."""
        target = self.target
        timed_out = ScrapeError("timeout", f"no complete answer within {target.timeout_s:g}s")
        keep = False
        with _Deadline(target.timeout_s) as deadline:
            try:
                answer = self._get(deadline) if self._direct else None
                if answer is None:  # urllib's way
                    request = urllib.request.Request(target.url, headers=self._headers)
                    request.deadline = deadline
                    answer = _OPENER.open(request, timeout=target.timeout_s)
                with answer:
                    openmetrics = answer.headers.get("Content-Type", "").startswith("application/openmetrics-text")
                    chunks, size = [], 0
                    while chunk := answer.read1(_CHUNK):  # what has arrived (read() would wait for a full chunk)
                        size += len(chunk)
                        if size > target.body_limit:
                            raise ScrapeError("body_limit", f"body larger than {target.body_limit} bytes (body_limit)")
                        chunks.append(chunk)
                    if deadline.passed:  # the end of the body, or the deadline's cut?
                        raise timed_out
                    keep = answer is self._response and not answer.will_close
            except urllib.error.HTTPError as exc:
                raise ScrapeError("http_status", f"HTTP {exc.code} {exc.reason}") from None
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                if deadline.passed or isinstance(reason, TimeoutError):  # (socket.timeout is TimeoutError)
                    raise timed_out from None
                if isinstance(exc, urllib.error.URLError):
                    raise ScrapeError("unreachable", f"cannot connect: {reason}") from None
                raise ScrapeError("unreachable", f"connection failed: {exc}") from None
            finally:
                if not keep:
                    self.close()
        if deadline.passed:  # cut after the body was read: the connection is shut down
            self.close()
        try:
            return b"".join(chunks).decode("utf-8"), openmetrics
        except UnicodeDecodeError as exc:
            raise ScrapeError("malformed", f"the body is not UTF-8: {exc}") from None

    def _get(self, deadline: _Deadline) -> http.client.HTTPResponse | None:
        """The answer over the kept connection (a new one if none), or None for urllib to take (a redirect).
        Raises urllib.error.HTTPError for a status urllib raises it for."""
        self._response = None
        reused = self._conn is not None
        if reused:
            self._conn.deadline = deadline  # (a connection http.client reopens tells it too)
            if self._conn.sock is not None:
                deadline.opened(self._conn.sock)
        else:
            self._conn = self._new_connection(deadline)
        try:
            answer = self._ask()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            if not reused or deadline.passed:
                raise
            self.close()  # closed by the target since the last scrape: once more, on a new connection
            self._conn = self._new_connection(deadline)
            answer = self._ask()
        if answer.status in _REDIRECTS:  # urllib's from now on (this scrape asks twice)
            answer.close()
            self.close()
            self._direct = False
            return None
        if not 200 <= answer.status < 300:
            answer.close()
            raise urllib.error.HTTPError(self.target.url, answer.status, answer.reason, answer.headers, None)
        self._response = answer
        return answer

    def _ask(self) -> http.client.HTTPResponse:
        self._conn.request("GET", self._selector, headers=self._headers)
        return self._conn.getresponse()

    def _new_connection(self, deadline: _Deadline):
        cls = _HTTPSConnection if self._https else _HTTPConnection
        conn = cls(self._netloc, timeout=self.target.timeout_s)
        conn.deadline = deadline
        return conn

    def close(self) -> None:
        self._response = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def fetch(target: ScrapeTarget) -> tuple[str, bool]:
    """One GET of `target` on a connection of its own (see `Fetcher.fetch`)."""
    fetcher = Fetcher(target)
    try:
        return fetcher.fetch()
    finally:
        fetcher.close()
