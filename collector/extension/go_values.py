"""Go's parsers for the values Jaeger's query API reads (it is written in Go, and clients send what
Go accepts): `time.ParseDuration`, `strconv.ParseBool`, `time.Parse(time.RFC3339Nano, ...)`.
Each raises ValueError with Go's own wording. `query_param` reads a parameter's raw value."""

from __future__ import annotations

import calendar
import re

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9,
             "h": 3600 * 10**9}
_TERM = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_TRUE, _FALSE = ("1", "t", "T", "TRUE", "true", "True"), ("0", "f", "F", "FALSE", "false", "False")
_RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d\d):(\d\d))")


def duration_ns(text: str) -> int:
    """time.ParseDuration: "1h2m", "1.5s", "300ms", "-2us", "0" -> nanoseconds."""
    body = text[1:] if text[:1] in ("+", "-") else text
    total, pos = 0.0, 0
    while pos < len(body) and body != "0":
        term = _TERM.match(body, pos)
        if term is None:
            break
        total, pos = total + float(term[1]) * _UNITS_NS[term[2]], term.end()
    if body != "0" and (not body or pos != len(body)) or total >= 1 << 63:
        raise ValueError(f'time: invalid duration "{text}"')
    return int(-total if text.startswith("-") else total)


def parse_bool(text: str) -> bool:
    """strconv.ParseBool."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{text}": invalid syntax')


def rfc3339_ns(text: str) -> int:
    """time.Parse(time.RFC3339Nano): "2026-08-18T10:00:00.000Z", "...+02:00" -> ns since the epoch."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValueError(f'parsing time "{text}" as "2006-01-02T15:04:05.999999999Z07:00": cannot parse')
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    if not (1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1] and h < 24 and mi < 60 and s < 60):
        raise ValueError(f'parsing time "{text}": day, month or time of day out of range')
    offset = 0 if m[8] else (1 if m[9] == "+" else -1) * (int(m[10]) * 3600 + int(m[11]) * 60)
    seconds = calendar.timegm((y, mo, d, h, mi, s)) - offset
    return seconds * 10**9 + int((m[7] or "").ljust(9, "0"))


def query_param(params: dict[str, list[str]], *names: str) -> str:
    """The value of the first of `names` the query gives non-empty (Jaeger: the canonical name wins over
    its aliases), else ""."""
    return next((params[n][0] for n in names if params.get(n, [""])[0] != ""), "")
