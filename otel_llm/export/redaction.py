"""What is shown of a value: `redact_url`, a URL as it may be shown (logs, `/health`, thread
names), without credentials; `echoed`, what an error message repeats of a client's value.

Endpoints come from flags and the environment (`OTEL_EXPORTER_OTLP_ENDPOINT=
https://user:token@host`, a remote-write URL with `?api_key=...`); the URL is
still used as given, only its displayed form is redacted. Like Go's
`url.URL.Redacted`, the secret is replaced by `xxxxx`; unlike it, the user name
goes too (a bare `token@host` is as common as `user:token@host`), and so does
every query value (any of them can be a key).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "xxxxx"


def redact_url(url: str | None) -> str | None:
    if not url or ("@" not in url and "?" not in url):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED  # unparseable: show nothing of it
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = urlencode([(key, REDACTED) for key, _ in parse_qsl(parts.query, keep_blank_values=True)], safe=REDACTED)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


ECHO_CHARS = 100  # of a client's value repeated in an error message


def echoed(value: str) -> str:
    """What an error message repeats of a value the client sent: at most its first ECHO_CHARS
    characters, then "..." (a 1 MB model name is not sent back in full)."""
    return value if len(value) <= ECHO_CHARS else value[:ECHO_CHARS] + "..."
