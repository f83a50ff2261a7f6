"""LoRA adapters: which requests wait and which run, per adapter; requests counted per adapter.

`LoraRequests` is vLLM 0.32's `LoRARequestStates` (`vllm/v1/metrics/stats.py`) on the
frontend's request handles: QUEUED and PREEMPTED make a request waiting, SCHEDULED running, a
finish (or a frontend failure) removes it; an adapter is listed while it has a waiting or a
running request, in the order it was (re)entered. On every step that carries a scheduler
snapshot (vLLM: every `SchedulerStats`) it does what vLLM's `PrometheusStatLogger.record` does
with `vllm:lora_requests_info`: sets the series `{max_lora, waiting_lora_adapters,
running_lora_adapters}` to the current wall time, the adapter names comma-joined. vLLM 0.32
puts every listed adapter in both labels (`update_scheduler_stats` writes each adapter's
waiting and running counts, zero or not, and the logger joins the keys), so both carry the same
list; and it keeps every series it ever set, so series accumulate (here: up to the cardinality
limit, then the overflow series, which holds the latest time).

Only requests that name an adapter cost anything: `arrival` records their handles, `step`
looks at a step's events and finishes only while such requests live (one vectorised
membership test, then work per LoRA request), and the token path never comes here.

`otel_llm.lora.requests` counts arriving requests per adapter (attribute
`otel_llm.lora.adapter`; GenAI semconv has no adapter attribute), for the `otel` profile and
OTLP; it counts whether or not `max_loras` is set.

Thread-safety: single writer; the owning Telemetry holds its lock around every call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otel_llm.canonical.cardinality import OVERFLOW, CardinalityLimiter
from otel_llm.canonical.instruments import LORA_INFO, LORA_REQUESTS
from otel_llm.engine.step import EventKind, StepRecord

INFO_LABELS = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")  # as prometheus_client sorts them
_QUEUED, _SCHEDULED, _PREEMPTED = int(EventKind.QUEUED), int(EventKind.SCHEDULED), int(EventKind.PREEMPTED)


@dataclass(frozen=True)
class LoraSnapshot:
    """One Telemetry's LoRA series, immutable (safe to render off-lock)."""

    max_loras: int  # 0: no LoRA config, `vllm:lora_requests_info` absent
    info: tuple[tuple[str, str, float], ...] = ()  # (waiting, running, unix s when last set), first set first
    info_overflow: float | None = None  # unix s when a combination beyond the limit was last set
    info_overflowed: int = 0  # measurements (sets) that went to the overflow series
    requests: tuple[tuple[str, int], ...] = ()  # (adapter, requests), first seen first
    requests_overflow: int = 0  # requests of adapters beyond the limit (the overflow series' value)

    @property
    def overflowed(self) -> dict[str, int]:
        """Overflowed measurements by canonical instrument."""
        return {LORA_INFO: self.info_overflowed, LORA_REQUESTS: self.requests_overflow}


class LoraRequests:
    """Per-adapter waiting/running requests of one Telemetry, and its two LoRA instruments."""

    def __init__(self, max_loras: int, cardinality_limit: int):
        self.max_loras = max_loras
        self.tracking = max_loras > 0  # vLLM tracks adapters only with a LoRA config
        self.live: dict[int, str] = {}  # handle -> adapter, requests not finished (tracking only)
        self._handles: np.ndarray | None = None  # `live`'s keys as an array, rebuilt after a change
        self._adapters: dict[str, tuple[set[int], set[int]]] = {}  # adapter -> (waiting, running) handles
        self._joined: str | None = None  # ",".join(_adapters), rebuilt after a change
        self._info = CardinalityLimiter(cardinality_limit)
        self._info_values: list[float] = []
        self._info_overflow: float | None = None
        self._counts = CardinalityLimiter(cardinality_limit)
        self._requests: list[int] = []

    def arrival(self, handle: int, adapter: str) -> None:
        slot = self._counts.slot(adapter)
        if slot != OVERFLOW:
            if slot == len(self._requests):
                self._requests.append(0)
            self._requests[slot] += 1
        if self.tracking:
            self.live[handle] = adapter
            self._handles = None

    def step(self, rec: StepRecord, wall_s: float) -> None:
        """A step's events, then its finishes (vLLM's order); then, on a snapshot step, the info series."""
        if self.live:
            for rids, finished in ((rec.event_rid, False), (rec.finished_rid, True)):
                if not len(rids):
                    continue
                if self._handles is None:
                    self._handles = np.fromiter(self.live, np.int64, len(self.live))
                hits = np.flatnonzero(np.isin(rids, self._handles)).tolist()
                if finished:
                    for i in hits:
                        self.finish(int(rids[i]))
                else:
                    kinds = rec.event_kind
                    for i in hits:
                        k = int(kinds[i])
                        if k in (_QUEUED, _SCHEDULED, _PREEMPTED):
                            self._update(int(rids[i]), k == _SCHEDULED)
        if rec.snapshot is not None:
            self.set_info(wall_s)

    def _update(self, handle: int, running: bool) -> None:
        adapter = self.live[handle]
        states = self._adapters.get(adapter)
        if states is None:
            states = self._adapters[adapter] = (set(), set())
            self._joined = None
        waiting_set, running_set = states
        (running_set if running else waiting_set).add(handle)
        (waiting_set if running else running_set).discard(handle)

    def finish(self, handle: int) -> None:
        """The request is gone (finished, aborted, failed by the frontend); unknown handles are ignored."""
        adapter = self.live.pop(handle, None)
        if adapter is None:
            return
        self._handles = None
        states = self._adapters.get(adapter)
        if states is not None:
            states[0].discard(handle)
            states[1].discard(handle)
            if not (states[0] or states[1]):
                del self._adapters[adapter]
                self._joined = None

    def set_info(self, wall_s: float) -> None:
        """`vllm:lora_requests_info`'s `labels(...).set_to_current_time()` for the current adapters."""
        if self._joined is None:
            self._joined = ",".join(self._adapters)
        slot = self._info.slot((self._joined, self._joined))
        if slot == OVERFLOW:
            self._info_overflow = wall_s
        elif slot == len(self._info_values):
            self._info_values.append(wall_s)
        else:
            self._info_values[slot] = wall_s

    def snapshot(self) -> LoraSnapshot | None:
        """None while there is nothing to show (no LoRA config and no request named an adapter)."""
        if not self.tracking and not len(self._counts):
            return None
        info = tuple((w, r, v) for (w, r), v in zip(self._info.keys(), self._info_values))
        return LoraSnapshot(self.max_loras, info, self._info_overflow, self._info.overflowed,
                            tuple(zip(self._counts.keys(), self._requests)), self._counts.overflowed)


def fold_lora(snapshots: list[LoraSnapshot]) -> LoraSnapshot | None:
    """LoRA snapshots of sources beyond a renderer's limit, as one: their info series kept (they
    carry no model label; `merge_info` bounds them), every request in the overflow count."""
    if not snapshots:
        return None
    over = [s.info_overflow for s in snapshots if s.info_overflow is not None]
    return LoraSnapshot(max(s.max_loras for s in snapshots), tuple(i for s in snapshots for i in s.info),
                        max(over) if over else None, sum(s.info_overflowed for s in snapshots), (),
                        sum(s.requests_overflow + sum(c for _, c in s.requests) for s in snapshots))


def merge_info(snapshots: list[LoraSnapshot], limit: int
               ) -> tuple[list[tuple[tuple[str, str, str], float]], float | None, int]:
    """The info series of sources rendered together ((max_lora, running, waiting) -> latest time,
    first set first), at most `limit` of them; (series, overflow series' value or None, series
    that went to the overflow series here). With LoRA configs only."""
    snapshots = [s for s in snapshots if s.max_loras > 0]
    over = [s.info_overflow for s in snapshots if s.info_overflow is not None]
    merged: dict[tuple[str, str, str], float] = {}
    for s in snapshots:
        max_lora = str(s.max_loras)
        for waiting, running, value in s.info:
            key = (max_lora, running, waiting)
            if merged.get(key, -np.inf) < value:
                merged[key] = value
    series = list(merged.items())
    rest = series[limit:]
    if rest:
        series = series[:limit]
        over.append(max(v for _, v in rest))
    return series, max(over) if over else None, len(rest)
