"""One scrape's HTTP GET: the whole answer within the target's timeout, at most its body limit.

The timeout is one deadline for the connection, the status line, the headers and the body: a
timer shuts down every socket the fetch opened when it passes (a per-read timeout, which
`urlopen` has, lets a target that trickles a byte at a time hold a scrape for ever).
"""

from __future__ import annotations

import functools
import http.client
import socket
import threading
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from otel_llm.collector.receiver.scrape_convert import ScrapeError

if TYPE_CHECKING:
    from otel_llm.collector.receiver.scrape import ScrapeTarget

ACCEPT = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
_CHUNK = 64 * 1024


class _Deadline:
    """Every socket one fetch opens, shut down when the scrape's time is up."""

    def __init__(self, timeout_s: float) -> None:
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.passed = False
        self._timer = threading.Timer(timeout_s, self._cut)
        self._timer.daemon = True

    def opened(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if not self.passed:
                return
        self._cut()

    def _cut(self) -> None:
        with self._lock:
            self.passed = True
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the reading thread sees the end at once
            except OSError:
                pass

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()


class _Connection:
    """Tells the fetch's `_Deadline` of its socket once connected."""

    def __init__(self, *args, opened, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._opened = opened

    def connect(self) -> None:
        super().connect()
        self._opened(self.sock)


class _HTTPConnection(_Connection, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Connection, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(functools.partial(_HTTPConnection, opened=req.deadline.opened), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(functools.partial(_HTTPSConnection, opened=req.deadline.opened), req,
                            context=self._context)


_OPENER = urllib.request.build_opener(_HTTPHandler, _HTTPSHandler)


def fetch(target: ScrapeTarget) -> tuple[str, bool]:
    """(body, is OpenMetrics) within `target.timeout_s` in all. Raises ScrapeError: unreachable,
    http_status, timeout, body_limit, malformed."""
    request = urllib.request.Request(target.url, headers={
        "Accept": ACCEPT, "User-Agent": "otel-llm-collector",
        "X-Prometheus-Scrape-Timeout-Seconds": f"{target.timeout_s:g}"})
    timed_out = ScrapeError("timeout", f"no complete answer within {target.timeout_s:g}s")
    with _Deadline(target.timeout_s) as deadline:
        request.deadline = deadline
        try:
            with _OPENER.open(request, timeout=target.timeout_s) as answer:
                openmetrics = answer.headers.get("Content-Type", "").startswith("application/openmetrics-text")
                chunks, size = [], 0
                while chunk := answer.read1(_CHUNK):  # what has arrived (read() would wait for a full chunk)
                    size += len(chunk)
                    if size > target.body_limit:
                        raise ScrapeError("body_limit", f"body larger than {target.body_limit} bytes (body_limit)")
                    chunks.append(chunk)
                if deadline.passed:  # the end of the body, or the deadline's cut?
                    raise timed_out
        except urllib.error.HTTPError as exc:
            raise ScrapeError("http_status", f"HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if deadline.passed or isinstance(reason, TimeoutError):  # (socket.timeout is TimeoutError)
                raise timed_out from None
            if isinstance(exc, urllib.error.URLError):
                raise ScrapeError("unreachable", f"cannot connect: {reason}") from None
            raise ScrapeError("unreachable", f"connection failed: {exc}") from None
    try:
        return b"".join(chunks).decode("utf-8"), openmetrics
    except UnicodeDecodeError as exc:
        raise ScrapeError("malformed", f"the body is not UTF-8: {exc}") from None
