"""`SpanLimiter`: span limits for spans built retroactively.

The SDK enforces its `SpanLimits` only on live spans (`Tracer.start_span`). The
gen_ai spans (`otel_llm.frontend.request_spans`) and the reference server's HTTP spans are
finished `ReadableSpan`s handed straight to the span processors, so they are
bounded here, by the provider's own `SpanLimits`: what it was built with, by
default read from OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT (or OTEL_ATTRIBUTE_COUNT_LIMIT,
default 128), OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT (or
OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT) and OTEL_SPAN_EVENT_COUNT_LIMIT (default 128).

- Strings longer than the value-length limit are cut; in arrays, element by element.
- Over a count limit, the first attributes/events are kept (the spec's "discard the
  new one"; the first are the identifying ones) and the rest dropped and counted
  (exported as the span's `dropped_attributes_count` / `dropped_events_count`).
- One difference from the SDK: with no value-length limit configured, strings are cut
  at `DEFAULT_VALUE_LENGTH` characters instead of never, since request fields (stop
  strings, request ids, URL paths, captured messages) would otherwise make a span as
  large as a client likes. Set the variable to a larger number to keep more.
"""

from __future__ import annotations

from itertools import islice

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.util import BoundedList

DEFAULT_VALUE_LENGTH = 4096


class SpanLimiter:
    """Bounds one span's attributes and events. Immutable after construction: any thread may use it."""

    __slots__ = ("max_attributes", "max_value_length", "max_events")

    def __init__(self, limits: SpanLimits):
        self.max_attributes: int | None = limits.max_span_attributes  # None = no limit
        self.max_events: int | None = limits.max_events
        length = limits.max_span_attribute_length
        self.max_value_length: int = DEFAULT_VALUE_LENGTH if length is None else length

    def attributes(self, attributes: dict, strings: list | None = None):
        """`attributes` itself when within the limits (the per-span cost: one pass over the values),
        else a bounded copy. Values are str, numbers, bools or tuples of those (as these spans use).
        `strings`: the only values that may be too long, when the caller knows (the others fixed and
        bounded once): only they are checked."""
        n, most = self.max_value_length, self.max_attributes
        fits = most is None or len(attributes) <= most
        if fits and not _too_long(attributes.values() if strings is None else strings, n):
            return attributes
        cut = {key: _cut(value, n) for key, value in attributes.items()}
        if fits:
            return cut
        bounded = BoundedAttributes(most, dict(islice(cut.items(), most)))
        bounded.dropped = len(attributes) - most
        return bounded

    def events(self, events):
        """`events` itself when within the count limit, else its first `max_events` (the rest counted)."""
        most = self.max_events
        if most is None or len(events) <= most:
            return events
        bounded = BoundedList(most)
        bounded.extend(events[:most])
        bounded.dropped = len(events) - most
        return bounded


def _too_long(values, n: int) -> bool:
    for value in values:
        if type(value) is str:
            if len(value) > n:
                return True
        elif type(value) is tuple:
            for item in value:
                if type(item) is str and len(item) > n:
                    return True
    return False


def _cut(value, n: int):
    if type(value) is str:
        return value[:n]
    if type(value) is tuple:
        return tuple(item[:n] if type(item) is str else item for item in value)
    return value
