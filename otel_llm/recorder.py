"""Engine-side recording: stamp lifecycle events and step outputs, nothing more.

`StepRecorder` lives in the engine loop. It is owned by one thread (the engine
loop) and is not thread-safe. Each call appends to Python lists or numpy arrays;
`end_step()` stamps one timestamp for the step and returns the `StepRecord` (or
its bytes) for the frontend. No aggregation, no span building, no JSON here.

A disabled recorder (`StepRecorder(enabled=False)`) turns every call into a
no-op and `end_step()` returns None.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from .step import EventKind, FinishReason, SchedulerSnapshot, StepRecord, ones_i4

_EMPTY_I8 = np.zeros(0, np.int64)
_EMPTY_I4 = np.zeros(0, np.int32)
_EMPTY_U1 = np.zeros(0, np.uint8)


class StepRecorder:
    """Collects one engine step's events and outputs; engine-loop thread only."""

    def __init__(self, enabled: bool = True, clock=time.monotonic_ns):
        self.enabled = enabled
        self._clock = clock
        # One (wall, monotonic) anchor per process: spans convert engine times with it.
        self.anchor_wall_ns, self.anchor_mono_ns = time.time_ns(), clock()
        self._reset()

    def _reset(self) -> None:
        self._ev_rid: list[int] = []
        self._ev_ts: list[int] = []
        self._ev_val: list[int] = []
        self._ev_kind: list[int] = []
        self._out_rid: list[np.ndarray] = []
        self._out_n: list[np.ndarray] = []
        self._fin_rid: list[int] = []
        self._fin_reason: list[int] = []
        self._fin_max: list[int] = []
        self._snapshot: SchedulerSnapshot | None = None
        self._all_one = True

    def _event(self, rid: int, kind: EventKind, value: int = 0) -> None:
        if self.enabled:
            self._ev_rid.append(rid)
            self._ev_ts.append(self._clock())
            self._ev_val.append(value)
            self._ev_kind.append(kind)

    def queued(self, rid: int) -> None:
        """The request entered the engine's waiting queue."""
        self._event(rid, EventKind.QUEUED)

    def scheduled(self, rid: int, num_cached_tokens: int = 0) -> None:
        """The request was (re)scheduled; `num_cached_tokens` = prefix-cache hit, tokens."""
        self._event(rid, EventKind.SCHEDULED, num_cached_tokens)

    def preempted(self, rid: int) -> None:
        """The request was preempted (its KV blocks freed, it goes back to waiting)."""
        self._event(rid, EventKind.PREEMPTED)

    def outputs(self, rids: Sequence[int] | np.ndarray, num_new_tokens: Sequence[int] | np.ndarray | int = 1) -> None:
        """Requests that produced `num_new_tokens` tokens this step (vectorised)."""
        if not self.enabled:
            return
        rid = np.asarray(rids, dtype=np.int64)
        if isinstance(num_new_tokens, int) and num_new_tokens == 1:
            n = ones_i4(len(rid))
        else:
            n = np.broadcast_to(np.asarray(num_new_tokens, dtype=np.int32), rid.shape)
            # all ones however they were given: the frontend's steady-decode fast path needs the flag
            self._all_one = self._all_one and bool((n == 1).all())
        self._out_rid.append(rid)
        self._out_n.append(n)

    def output(self, rid: int, num_new_tokens: int = 1) -> None:
        """One request's output this step (prefer `outputs` for a whole batch)."""
        self.outputs((rid,), (num_new_tokens,))

    def finished(self, rid: int, reason: FinishReason | int, max_seq_tokens: int = 0) -> None:
        """The request finished (after its last output of this step, if any).

        `max_seq_tokens`: for n > 1 parallel sequences, the longest one's length.
        """
        if self.enabled:
            self._fin_rid.append(rid)
            self._fin_reason.append(int(reason))
            self._fin_max.append(max_seq_tokens)

    def snapshot(self, snapshot: SchedulerSnapshot) -> None:
        """Attach the scheduler snapshot for this step (callers may throttle, e.g. 1 Hz)."""
        if self.enabled:
            self._snapshot = snapshot

    def end_step(self, num_computed_prompt_tokens: int = 0) -> StepRecord | None:
        """Close the step: one timestamp for all its outputs. Returns None when disabled."""
        if not self.enabled:
            return None
        ts = self._clock()
        if len(self._out_rid) == 1:
            out_rid, out_n = self._out_rid[0], self._out_n[0]
        else:
            out_rid = np.concatenate(self._out_rid) if self._out_rid else _EMPTY_I8
            out_n = np.concatenate(self._out_n) if self._out_n else _EMPTY_I4
        rec = StepRecord(
            ts, self.anchor_wall_ns, self.anchor_mono_ns, num_computed_prompt_tokens,
            np.array(self._ev_rid, np.int64) if self._ev_rid else _EMPTY_I8,
            np.array(self._ev_ts, np.int64) if self._ev_ts else _EMPTY_I8,
            np.array(self._ev_val, np.int64) if self._ev_val else _EMPTY_I8,
            np.array(self._ev_kind, np.uint8) if self._ev_kind else _EMPTY_U1,
            out_rid, out_n,
            np.array(self._fin_rid, np.int64) if self._fin_rid else _EMPTY_I8,
            np.array(self._fin_reason, np.uint8) if self._fin_reason else _EMPTY_U1,
            np.array(self._fin_max, np.int32) if self._fin_max else _EMPTY_I4,
            self._snapshot,
            self._all_one,
        )
        self._reset()
        return rec

    def end_step_bytes(self, num_computed_prompt_tokens: int = 0) -> bytes | None:
        """`end_step` serialised for a process boundary (None when disabled)."""
        rec = self.end_step(num_computed_prompt_tokens)
        return rec.to_bytes() if rec is not None else None
