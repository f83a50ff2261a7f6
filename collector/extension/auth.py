"""Server authenticators for every listener (the OpenTelemetry Collector's `bearertokenauth` and
`basicauth` extensions, in their semantics): `--auth bearer-token-file=PATH` or
`--auth htpasswd-file=PATH`.

- `BearerTokenAuth`: ``Authorization: Bearer <token>``, the token the file holds (surrounding
  whitespace stripped). The file is read again when it changes (checked at most once a second), so
  a token is rotated by rewriting it.
- `BasicAuth`: ``Authorization: Basic base64(user:password)`` against an htpasswd file: lines
  ``user:password`` (plain, as the Collector's ``htpasswd.inline`` takes), ``user:{SHA}...``
  (``htpasswd -s``) or bcrypt ``user:$2y$...`` (``htpasswd -B``; needs the ``bcrypt`` package).
  Credentials that matched are remembered (their SHA-256, at most 1024), so a sender pays
  bcrypt's cost once, not on every export.

Credentials are compared in constant time and never logged. Thread-safe: `check` is called from
every listener's threads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
import time
from dataclasses import dataclass, field

_RELOAD_CHECK_S = 1.0
_MAX_ACCEPTED = 1024  # remembered credentials that matched


class BearerTokenAuth:
    scheme = "Bearer"

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._token, self._mtime, self._checked = self._read(), os.stat(path).st_mtime_ns, time.monotonic()

    def _read(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ValueError(f"bearer token file {self.path}: {exc.strerror}") from None
        if not token or b"\n" in token:
            raise ValueError(f"bearer token file {self.path}: must hold one token on one line")
        return token

    def _current(self) -> bytes:
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= _RELOAD_CHECK_S:
                self._checked = now
                try:
                    mtime = os.stat(self.path).st_mtime_ns
                    if mtime != self._mtime:
                        self._token, self._mtime = self._read(), mtime
                except (OSError, ValueError):
                    pass  # keep the last good token; a half-written file is read again next time
            return self._token

    def check(self, authorization: str | None) -> bool:
        scheme, _, credentials = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), self._current())

    def describe(self) -> str:
        return f"bearer token from {self.path}"


@dataclass(frozen=True)
class _Password:
    kind: str  # plain, sha, bcrypt
    value: bytes

    def matches(self, password: bytes) -> bool:
        if self.kind == "sha":
            return hmac.compare_digest(base64.b64encode(hashlib.sha1(password).digest()), self.value)
        if self.kind == "bcrypt":
            import bcrypt

            return bcrypt.checkpw(password, self.value)
        return hmac.compare_digest(password, self.value)


@dataclass(frozen=True)
class BasicAuth:
    path: str
    users: dict[bytes, _Password] = field(default_factory=dict)
    # SHA-256 of credentials that matched: a bcrypt check costs ~0.1-0.3 s of CPU, too much for
    # every export of every sender
    _accepted: dict[bytes, None] = field(default_factory=dict, compare=False, repr=False)
    scheme = "Basic"

    @classmethod
    def from_file(cls, path: str) -> BasicAuth:
        try:
            with open(path, "rb") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            raise ValueError(f"htpasswd file {path}: {exc.strerror}") from None
        users = {}
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.startswith(b"#"):
                continue
            user, sep, secret = line.partition(b":")
            if not sep or not user:
                raise ValueError(f"htpasswd file {path}, line {number}: not user:password")
            users[user] = _parse_secret(secret, f"htpasswd file {path}, line {number}")
        if not users:
            raise ValueError(f"htpasswd file {path}: no users")
        return cls(path, users)

    def check(self, authorization: str | None) -> bool:
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        seen = hashlib.sha256(credentials.strip().encode()).digest()
        if seen in self._accepted:
            return True
        try:
            user, sep, password = base64.b64decode(credentials.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        entry = self.users.get(user)
        if not sep or entry is None:
            _Password("plain", b"\0" * 16).matches(password)  # the same work for an unknown user
            return False
        if not entry.matches(password):
            return False
        if len(self._accepted) >= _MAX_ACCEPTED:
            self._accepted.clear()
        self._accepted[seen] = None
        return True

    def describe(self) -> str:
        return f"basic auth, {len(self.users)} user(s) from {self.path}"


def _parse_secret(secret: bytes, where: str) -> _Password:
    if secret.startswith(b"{SHA}"):
        return _Password("sha", secret[5:])
    if secret[:4] in (b"$2a$", b"$2b$", b"$2y$"):
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise ValueError(f"{where}: a bcrypt hash needs the bcrypt package (pip install bcrypt)") from None
        return _Password("bcrypt", secret)
    if secret.startswith((b"$apr1$", b"$1$", b"$5$", b"$6$")):
        raise ValueError(f"{where}: this hash is not supported; use bcrypt (htpasswd -B), SHA (htpasswd -s) "
                         "or a plain password")
    return _Password("plain", secret)


Authenticator = BearerTokenAuth | BasicAuth


def parse_auth(text: str) -> Authenticator:
    """``bearer-token-file=PATH`` or ``htpasswd-file=PATH``; ValueError naming what is wrong."""
    kind, sep, path = text.partition("=")
    if not sep or not path:
        raise ValueError(f"{text!r}: use bearer-token-file=PATH or htpasswd-file=PATH")
    if kind == "bearer-token-file":
        return BearerTokenAuth(path)
    if kind == "htpasswd-file":
        return BasicAuth.from_file(path)
    raise ValueError(f"unknown authenticator {kind!r}: use bearer-token-file=PATH or htpasswd-file=PATH")
