"""LLM-aware tail sampling: hold a trace's spans until its root span arrives (or `decision_wait_s`
passed), then keep or drop the whole trace, knowing what a gen_ai request looks like.

A trace is kept, for the first of these reasons that applies:
- ``error`` / ``abort``: a span with status ERROR or an ``error.type`` (otel-llm sets both on
  aborted and failed requests; the reason is the ``error.type`` value when it is ``abort``);
- ``preempted``: a span with a ``preempted`` event (the request was preempted);
- ``slow_ttft`` / ``slow_e2e`` / ``slow_queue``: ``gen_ai.latency.time_to_first_token`` /
  ``gen_ai.latency.e2e`` / ``gen_ai.latency.time_in_queue`` (seconds; otel-llm's and vLLM's
  request spans carry them) above the configured threshold;
- ``sampled``: its trace id falls in `keep_fraction` (the lower 64 bits of the id as a fraction
  of 2^64, as OTel's TraceIdRatioBased sampler decides, so every collector agrees);
and dropped (``not_sampled``) otherwise. A generic tail sampler tests attributes span by span;
this one reads the request's shape: its root, its latency attributes, its events.

The engine lane's window spans (`engine steps`, `otel_llm.export.lane_spans`) are decided with the
requests, not on their own: each waits `lane_wait_s` (so the requests that ran in it can finish and be
decided), then is kept (``lane_overlap``) when a kept trace from the same process (the same resource)
overlaps it in time, and dropped (``lane_no_overlap``) otherwise. So every kept request keeps the
steps it ran in, and a window no kept request touched costs no storage. A request that finishes
more than `lane_wait_s` after a window ended does not keep that window.

Bounded: at most `max_traces` traces and `max_spans` spans wait; beyond that the oldest traces
are decided early with the spans they have. Spans that arrive after their trace was decided
follow the decision (the last `decided_cache` decisions are remembered); others start a new
trace. Thread-safety: `consume`, `tick` and `flush` may be called from any thread (one lock);
kept spans go to `emit` after the lock is released.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.collector.pdata.request_span import request_facts
from otel_llm.collector.pdata.traces_wire import encode_spans
from otel_llm.export.lane_spans import LANE_SPAN


@dataclass(frozen=True)
class TailSamplingConfig:
    decision_wait_s: float = 10.0  # after a trace's first span, decide even without its root
    ttft_above_s: float | None = 2.0  # None: not a reason to keep
    e2e_above_s: float | None = 60.0
    queue_above_s: float | None = 5.0
    keep_fraction: float = 0.1  # of the traces no other reason keeps
    lane_wait_s: float = 60.0  # an engine lane window waits this long for the requests that ran in it
    max_traces: int = 50_000
    max_spans: int = 500_000
    decided_cache: int = 100_000

    def __post_init__(self) -> None:
        for name in ("decision_wait_s", "ttft_above_s", "e2e_above_s", "queue_above_s", "lane_wait_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"TailSamplingConfig.{name} must be >= 0 (or None), got {value!r}")
        if not (isinstance(self.keep_fraction, (int, float)) and 0 <= self.keep_fraction <= 1):
            raise ValueError(f"TailSamplingConfig.keep_fraction must be in [0, 1], got {self.keep_fraction!r}")
        for name in ("max_traces", "max_spans", "decided_cache"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"TailSamplingConfig.{name} must be an int >= 1, got {value!r}")


class SamplingStats(NamedTuple):
    traces: dict[tuple[str, str], int]  # (kept|dropped, reason) -> traces decided
    spans: dict[str, int]  # kept|dropped -> spans (late ones included)
    pending_traces: int
    pending_spans: int


@dataclass
class _Trace:
    first_seen: float
    spans: dict[tuple[bytes, bytes], list[bytes]] = field(default_factory=dict)  # (resource, scope) -> spans
    count: int = 0
    reason: str = ""  # the strongest reason to keep seen so far
    latency: dict[str, float] = field(default_factory=dict)
    has_root: bool = False
    resource: bytes = b""
    start: int = 0  # epoch ns: when its spans began and ended, where the lane windows it keeps lie
    end: int = 0


class _Window(NamedTuple):
    """An engine lane window span waiting for its decision."""

    first_seen: float
    resource: bytes
    scope: bytes
    start: int
    end: int
    raw: bytes


_MAX_KEPT_RANGES = 100_000  # per process: kept traces' time ranges remembered for its lane windows


class TailSampler:
    def __init__(self, config: TailSamplingConfig, emit: Callable[[bytes, int], None], clock=time.monotonic):
        self.config = config
        self._emit = emit
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: OrderedDict[bytes, _Trace] = OrderedDict()  # trace id -> trace, oldest first
        self._pending_spans = 0
        self._decided: OrderedDict[bytes, bool] = OrderedDict()  # trace id -> kept
        self._thresholds = {"ttft": config.ttft_above_s, "e2e": config.e2e_above_s, "queue": config.queue_above_s}
        self._keep_below = int(config.keep_fraction * 2**64)
        self._traces: Counter[tuple[str, str]] = Counter()  # (kept|dropped, reason) -> traces
        self._spans: Counter[str] = Counter()  # kept|dropped -> spans (late ones included)
        self._windows: OrderedDict[int, _Window] = OrderedDict()  # lane windows waiting, oldest first
        self._window_seq = 0
        self._kept_ranges: dict[bytes, list[tuple[int, int]]] = {}  # resource -> (start, end) of kept traces

    def consume(self, spans: list[tuple[bytes, bytes, Span, bytes]]) -> None:
        """Spans as (resource, scope, the parsed span, the span serialized), from one request."""
        out: dict[tuple[bytes, bytes], list[bytes]] = {}
        with self._lock:
            now = self._clock()
            ready = []
            for resource, scope, span, raw in spans:
                if span.name == LANE_SPAN and not span.parent_span_id:
                    self._windows[self._window_seq] = _Window(now, resource, scope, span.start_time_unix_nano,
                                                              span.end_time_unix_nano, raw)
                    self._window_seq += 1
                    self._pending_spans += 1
                    continue
                trace_id = span.trace_id
                decided = self._decided.get(trace_id)
                if decided is not None:  # late: follows its trace's decision
                    self._spans["kept" if decided else "dropped"] += 1
                    if decided:
                        out.setdefault((resource, scope), []).append(raw)
                    continue
                trace = self._pending.get(trace_id)
                if trace is None:
                    trace = self._pending[trace_id] = _Trace(now)
                trace.spans.setdefault((resource, scope), []).append(raw)
                trace.resource = resource
                trace.start = min(trace.start or span.start_time_unix_nano, span.start_time_unix_nano)
                trace.end = max(trace.end, span.end_time_unix_nano)
                trace.count += 1
                self._pending_spans += 1
                self._inspect(trace, span)
                if not span.parent_span_id and not trace.has_root:
                    trace.has_root = True
                    ready.append(trace_id)
            for trace_id in ready:
                self._decide(trace_id, out)
            while len(self._pending) > self.config.max_traces or self._pending_spans > self.config.max_spans:
                if self._pending:
                    self._decide(next(iter(self._pending)), out)
                else:
                    self._decide_window(next(iter(self._windows)), out)
        self._send(out)

    def tick(self) -> None:
        """Decide the traces that waited `decision_wait_s` for their root."""
        out: dict[tuple[bytes, bytes], list[bytes]] = {}
        with self._lock:
            deadline = self._clock() - self.config.decision_wait_s
            while self._pending:
                trace_id, trace = next(iter(self._pending.items()))
                if trace.first_seen > deadline:
                    break
                self._decide(trace_id, out)
            lane_deadline = self._clock() - self.config.lane_wait_s
            while self._windows and next(iter(self._windows.values())).first_seen <= lane_deadline:
                self._decide_window(next(iter(self._windows)), out)
        self._send(out)

    def flush(self) -> None:
        """Decide every waiting trace now (shutdown)."""
        out: dict[tuple[bytes, bytes], list[bytes]] = {}
        with self._lock:
            while self._pending:
                self._decide(next(iter(self._pending)), out)
            while self._windows:
                self._decide_window(next(iter(self._windows)), out)
        self._send(out)

    def stats(self) -> SamplingStats:
        with self._lock:
            return SamplingStats(dict(self._traces), dict(self._spans), len(self._pending), self._pending_spans)

    def _inspect(self, trace: _Trace, span: Span) -> None:
        facts = request_facts(span)
        for name, value in zip(("ttft", "e2e", "queue"), facts):
            if value is not None:
                trace.latency[name] = value
        if facts.error and trace.reason not in ("error", "abort"):
            trace.reason = "abort" if facts.error_type == "abort" else "error"
        elif not trace.reason and any(e.name == "preempted" for e in span.events):
            trace.reason = "preempted"

    def _decide(self, trace_id: bytes, out: dict) -> None:
        trace = self._pending.pop(trace_id)
        self._pending_spans -= trace.count
        reason = trace.reason
        if not reason:
            for name, limit in self._thresholds.items():
                value = trace.latency.get(name)
                if limit is not None and value is not None and value > limit:
                    reason = f"slow_{name}"
                    break
        if not reason and int.from_bytes(trace_id[8:16], "big") < self._keep_below:
            reason = "sampled"
        kept = bool(reason)
        self._traces[("kept" if kept else "dropped", reason or "not_sampled")] += 1
        self._spans["kept" if kept else "dropped"] += trace.count
        if kept:
            for key, raws in trace.spans.items():
                out.setdefault(key, []).extend(raws)
            if self._windows or self._window_seq:  # lanes are in use: remember where kept requests ran
                self._kept_ranges.setdefault(trace.resource, []).append((trace.start, trace.end))
        self._decided[trace_id] = kept
        if len(self._decided) > self.config.decided_cache:
            self._decided.popitem(last=False)

    def _decide_window(self, key: int, out: dict) -> None:
        """Keep a lane window when a kept trace of its process overlaps it; forget the kept ranges no
        waiting window can overlap any more."""
        w = self._windows.pop(key)
        self._pending_spans -= 1
        ranges = self._kept_ranges.get(w.resource, [])
        kept = any(start <= w.end and end >= w.start for start, end in ranges)
        self._traces[("kept", "lane_overlap") if kept else ("dropped", "lane_no_overlap")] += 1
        self._spans["kept" if kept else "dropped"] += 1
        if kept:
            out.setdefault((w.resource, w.scope), []).append(w.raw)
        if ranges:  # a process's windows come in time order: a range that ended before this one began is done
            self._kept_ranges[w.resource] = [r for r in ranges if r[1] >= w.start][-_MAX_KEPT_RANGES:]

    def _send(self, out: dict[tuple[bytes, bytes], list[bytes]]) -> None:
        if out:
            self._emit(encode_spans(out), sum(len(v) for v in out.values()))
