"""A text exposition's skeleton: everything but its sample values, to see that a scrape is shaped as the last.

A target's `/metrics` keeps its families, help, types and label sets from one scrape to the next;
only the values move. `Skeleton.of` records, for a body prometheus_client has parsed, every line
but the sample lines whole, and each sample line's series text (all before its value);
`Skeleton.values` then takes the next body, and when every line but the values is the same, gives
its sample values, in order, as prometheus_client's text parser would read them, without
parsing the body: the caller's conversion plan for the last body then holds for this one.

Exactness: a sample line is recorded only when it is `SERIES VALUE` with SERIES a metric name
and, optionally, one `{...}` label block that ends it (quotes and escapes as prometheus_client
reads them); such a line parses to SERIES's sample with VALUE's value, whatever VALUE is, so a
body whose other lines and series texts are all equal parses to the same samples but for their
values. A value is read as prometheus_client's `_parse_value` reads it: anything it would not
take the same way (whitespace, `_`, or a line with a timestamp) makes the body not match, and
the caller parses it in full. OpenMetrics bodies are not handled here (their parser checks
values too).
"""

from __future__ import annotations

import json
import re
from itertools import repeat
from operator import itemgetter

# A metric name and an optional label block closing the text: outside quotes no `"`, `}` or `\`;
# inside quotes, `\` escapes the next character (prometheus_client's `_next_unquoted_char`).
_SERIES = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{(?:[^"}\\]|"(?:[^"\\]|\\.)*")*\})?')
_NUMBERS = {int, float}


class Skeleton:
    """The lines of one text exposition but its sample values. Immutable."""

    def __init__(self, num_lines: int, sample_at: list[int], heads: tuple[str, ...], other_at: list[int],
                 others: tuple[str, ...]) -> None:
        self._num_lines = num_lines
        self._samples_of, self._heads = _picker(sample_at), heads  # sample lines: their series texts
        self._others_of, self._others = _picker(other_at), others  # every other line, whole

    @classmethod
    def of(cls, text: str, values: list) -> Skeleton | None:
        """`text`'s skeleton, given its sample values as prometheus_client parsed them (`values`, in
        order); None when a line does not have the plain shape `values` can rely on."""
        lines = text.split("\n")  # (prometheus_client reads lines up to "\n" and strips them)
        sample_at, heads, tokens, other_at, others = [], [], [], [], []
        for i, line in enumerate(lines):
            stripped = line.strip()
            if not stripped or stripped[0] == "#":
                other_at.append(i)
                others.append(line)
                continue
            head, _, token = line.rpartition(" ")
            if not _SERIES.fullmatch(head):
                return None
            sample_at.append(i)
            heads.append(head)
            tokens.append(token)
        mine = read_values(tokens)
        if mine is None or len(mine) != len(values) or not all(a == b or (a != a and b != b)
                                                                for a, b in zip(mine, values)):
            return None
        return cls(len(lines), sample_at, tuple(heads), other_at, tuple(others))

    def values(self, text: str) -> list | None:
        """`text`'s sample values when it has this skeleton, else None."""
        lines = text.split("\n")
        if len(lines) != self._num_lines or self._others_of(lines) != self._others:
            return None
        columns = tuple(zip(*map(str.rpartition, self._samples_of(lines), repeat(" "))))  # heads, " ", tokens
        heads, tokens = (columns[0], columns[2]) if columns else ((), ())
        if heads != self._heads:
            return None
        return read_values(tokens)


def read_values(tokens: tuple[str, ...] | list[str]) -> list | None:
    """Each token's value as prometheus_client reads a sample's value, or None if one is not a
    plain number (the caller then lets prometheus_client parse the body and say what is wrong)."""
    # All at once: a JSON number is what int() or float() reads in prometheus_client's `_parse_value`
    # (integers exactly; NaN, Infinity), and as many numbers as tokens (no true, string, list, ...)
    # means one per token (a token with a comma would make two). Tabs and CRs: token by token.
    joined = ",".join(tokens).replace("+Inf", "Infinity").replace("-Inf", "-Infinity")
    if "\t" not in joined and "\r" not in joined:
        try:
            values = json.loads(f"[{joined}]")
        except ValueError:
            values = None
        if values is not None and len(values) == len(tokens) and set(map(type, values)) <= _NUMBERS:
            return values
    try:
        return [_value(token) for token in tokens]
    except ValueError:
        return None


def _value(token: str) -> int | float:
    """prometheus_client.parser._parse_value, for a token without spaces."""
    if token != token.strip() or "_" in token:
        raise ValueError(f"Invalid value: {token!r}")
    try:
        return int(token)
    except ValueError:
        return float(token)


def _picker(indices: list[int]):
    """lines -> the tuple of those lines (itemgetter, which gives a bare item for one index)."""
    if len(indices) > 1:
        return itemgetter(*indices)
    return lambda lines: tuple(lines[i] for i in indices)
