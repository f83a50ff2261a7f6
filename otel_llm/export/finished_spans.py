"""Finished spans built from recorded times, cheaper than the SDK's constructors make them.

The gen_ai request spans (`otel_llm.frontend.request_spans`) and the pipeline's are built when a
request finishes, as SDK `ReadableSpan`s handed straight to the span processors. `FinishedSpan`
keeps what every such span shares (no links, no instrumentation info, this package's scope) on
its class: 10 stores instead of 13 and no keyword defaults, ~35% cheaper; `RecordedEvent` shares
one read-only empty attribute mapping. Both are checked against the installed SDK's constructors
when this module loads (`own_constructors_match`): an SDK whose spans or events hold more fields
gets them built by its own constructors.
"""

from __future__ import annotations

from types import MappingProxyType

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind
from opentelemetry.trace.status import Status, StatusCode

SCOPE = InstrumentationScope("otel_llm", "0.1.0")
UNSET = Status(StatusCode.UNSET)  # shared: spans are read-only


class FinishedSpan(ReadableSpan):
    """A `ReadableSpan` built from recorded times, what every such span shares on the class. Read
    like any ReadableSpan (a test encodes both alike)."""

    _links = ()
    _instrumentation_info = None
    _instrumentation_scope = SCOPE

    def __init__(self, name: str, context: SpanContext, parent: SpanContext | None, resource, attributes,
                 start_time: int, end_time: int, events=(), kind: SpanKind = SpanKind.INTERNAL,
                 status: Status = UNSET):
        self._name = name
        self._context = context
        self._parent = parent
        self._resource = resource
        self._attributes = attributes
        self._start_time = start_time
        self._end_time = end_time
        self._events = events
        self._kind = kind
        self._status = status


def child_span_class(resource):
    """A constructor `(name, context, parent, attributes, start_time, end_time)` of INTERNAL spans of
    `resource` without events (a request's queue, prefill and decode): those kept on the class too,
    6 stores a span. With an SDK whose spans hold more fields, its own constructor builds them."""
    if not _SPANS_MATCH:
        return lambda name, context, parent, attributes, start_time, end_time: FinishedSpan(
            name, context, parent, resource, attributes, start_time, end_time)

    class ChildSpan(FinishedSpan):
        _resource = resource
        _events = ()
        _kind = SpanKind.INTERNAL
        _status = UNSET

        def __init__(self, name: str, context: SpanContext, parent: SpanContext, attributes, start_time: int,
                     end_time: int):
            self._name = name
            self._context = context
            self._parent = parent
            self._attributes = attributes
            self._start_time = start_time
            self._end_time = end_time

    return ChildSpan


class RecordedEvent(Event):
    """A span `Event` at a recorded time, without attributes (a shared, read-only empty mapping):
    half what `Event(name, {}, time)` costs, and no dict per event for the garbage collector to track."""

    _attributes = MappingProxyType({})

    def __init__(self, name: str, timestamp: int):
        self._name = name
        self._timestamp = timestamp


def _sdk_span_init(self, name, context, parent, resource, attributes, start_time, end_time, events=(),
                   kind=SpanKind.INTERNAL, status=UNSET):
    ReadableSpan.__init__(self, name, context, parent, resource, attributes, events, (), kind, None, status,
                          start_time, end_time, SCOPE)


def _sdk_event_init(self, name, timestamp):
    Event.__init__(self, name, {}, timestamp)


def own_constructors_match() -> tuple[bool, bool]:
    """Whether `FinishedSpan` and `RecordedEvent` (their stores and class attributes) hold exactly the
    fields the installed SDK's `ReadableSpan` and `Event` constructors set (checked when this module
    loads; the SDK's releases so far set the same 13 and 3)."""
    empty = Resource.get_empty()
    span = set(vars(FinishedSpan("probe", None, None, empty, {}, 0, 0))) | {
        "_links", "_instrumentation_info", "_instrumentation_scope"}
    event = set(vars(RecordedEvent("probe", 0))) | {"_attributes"}
    return span == set(vars(ReadableSpan("probe", resource=empty))), event == set(vars(Event("probe", {}, 0)))


_SPANS_MATCH, _EVENTS_MATCH = own_constructors_match()
if not _SPANS_MATCH:  # an SDK whose spans hold more (a field a later release adds): built its own way
    FinishedSpan.__init__ = _sdk_span_init
if not _EVENTS_MATCH:
    RecordedEvent.__init__ = _sdk_event_init
