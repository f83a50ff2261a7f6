"""One persistent HTTP/1.1 connection that POSTs request bodies: what every HTTP exporter of the
collector (remote-write, OTLP/HTTP traces) sends with.

`post` returns the answer (status, headers, the first 64 KiB of the body) or raises
`RetryableError` when the request did not get an answer (connect, send or read failed, timed
out); each exporter decides from the status what to retry. The connection is reopened after a
failure or when the server closes it.

Thread-safety: `post` and `close` belong to one thread (the exporter queue's); `abort` may be
called from any thread to make a POST in flight fail at once (shutdown).
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import math
import re
import socket
import threading
import time
import urllib.parse
from typing import NamedTuple

from otel_llm.collector.exporter.queue import RetryableError
from otel_llm.export.redaction import redact_url

_MAX_LOGGED_BODY_CHARS = 512
_MAX_READ_BODY_BYTES = 64 * 1024  # a longer answer is cut and its connection closed
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class HttpAnswer(NamedTuple):
    status: int
    headers: http.client.HTTPMessage
    body: bytes  # at most 64 KiB

    def text(self) -> str:
        """The body for a log line: decoded, stripped, truncated."""
        text = self.body.decode("utf-8", errors="replace").strip()
        if len(text) > _MAX_LOGGED_BODY_CHARS:
            return text[:_MAX_LOGGED_BODY_CHARS] + "... (truncated)"
        return text or "(empty body)"

    def retry_after_s(self) -> float | None:
        """``Retry-After`` as seconds from now: delay-seconds or an HTTP date; None if absent or invalid."""
        value = self.headers.get("Retry-After")
        if not value:
            return None
        try:
            seconds = float(value)
            return max(0.0, seconds) if math.isfinite(seconds) else None
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def check_http_url(url: object, what: str) -> urllib.parse.SplitResult:
    """``url`` split, or ValueError naming ``what`` and the URL when it is not http(s) with a host."""
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an http(s) URL with a host, got {redact_url(url) if isinstance(url, str) else url!r}")
    try:
        parts.port  # noqa: B018 -- raises on a bad port
    except ValueError:
        raise ValueError(f"{what} has an invalid port: {redact_url(url)!r}") from None
    return parts


def check_headers(headers: object, reserved: frozenset[str], what: str) -> None:
    """ValueError unless ``headers`` are (name, value) pairs of valid names and one-line values,
    none of them ``reserved`` (lower-case names the exporter sets itself)."""
    for header in headers:  # type: ignore[union-attr]
        if not (isinstance(header, tuple) and len(header) == 2
                and all(isinstance(x, str) for x in header) and _TOKEN.match(header[0])
                and not any(c in header[1] for c in "\r\n\0")):
            raise ValueError(f"{what}: {header!r} is not a (name, value) pair "
                             "of a valid header name and a one-line value")
        if header[0].lower() in reserved | {"content-length", "host"}:
            raise ValueError(f"{what} must not set {header[0]!r}; the exporter sets it")


class HttpSender:
    """Credentials in the URL (`https://user:token@host/...`) are sent as HTTP Basic auth, unless
    `headers` has its own Authorization; `url` (logs, error messages) is the redacted URL."""

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str]) -> None:
        parts = urllib.parse.urlsplit(url)
        self.url = redact_url(url)
        if parts.username is not None and not any(k.lower() == "authorization" for k in headers):
            userinfo = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            headers = {**headers, "Authorization": f"Basic {base64.b64encode(userinfo.encode()).decode()}"}
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._timeout_s = timeout_s
        self._headers = headers
        self._lock = threading.Lock()  # guards the reference only
        self._conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes) -> HttpAnswer:
        try:
            conn = self._connection()
            conn.request("POST", self._path, body, self._headers)
            response = conn.getresponse()
            data = response.read(_MAX_READ_BODY_BYTES)
            if not response.isclosed() or response.getheader("Connection", "").lower() == "close":
                self.close()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise RetryableError(f"POST {self.url} failed: {exc!r}") from exc
        return HttpAnswer(response.status, response.headers, data)

    def _connection(self) -> http.client.HTTPConnection:
        with self._lock:
            if self._conn is None:
                cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                self._conn = cls(self._host, self._port, timeout=self._timeout_s)
            return self._conn

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def abort(self) -> None:
        """Make a POST in flight fail now (its read sees the socket shut down)."""
        with self._lock:
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
