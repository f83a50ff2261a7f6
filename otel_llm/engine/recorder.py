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

from otel_llm.engine.clock import ANCHOR_MONO_NS, ANCHOR_WALL_NS
from otel_llm.engine.kv_residency import KVEvictions
from otel_llm.engine.step import (
    MAX_SPEC_POSITIONS, EventKind, FinishReason, SchedulerSnapshot, SpecDecodingStats, StepLane, StepRecord, ones_i4,
    outputs_only_record,
)

_EMPTY_I8 = np.zeros(0, np.int64)
_EMPTY_I4 = np.zeros(0, np.int32)
_EMPTY_U1 = np.zeros(0, np.uint8)


class StepRecorder:
    """Collects one engine step's events and outputs; engine-loop thread only."""

    def __init__(self, enabled: bool = True, clock=time.monotonic_ns):
        self.enabled = enabled
        self._clock = clock
        # One (wall, monotonic) anchor per process: spans convert engine times with it.
        self.anchor_wall_ns, self.anchor_mono_ns = (ANCHOR_WALL_NS, ANCHOR_MONO_NS) if clock is time.monotonic_ns \
            else (time.time_ns(), clock())
        self._reset()
        # What only some engines report; reset by `_take_extension` only when used (steady steps pay nothing).
        self._extended = False  # this step has some
        self._ev_external: list[tuple[int, int]] = []  # (event index, KV-connector hit tokens), only the nonzero
        self._spec: list | None = None  # [drafts, draft tokens, accepted, accepted per position]
        self._kv: KVEvictions | None = None

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
        self._lane: StepLane | None = None
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

    def scheduled(self, rid: int, num_cached_tokens: int = 0, num_external_cached_tokens: int = 0) -> None:
        """The request was (re)scheduled. Its first scheduling's hits (tokens) split its prompt, as
        vLLM's: `num_cached_tokens` from the local prefix cache, `num_external_cached_tokens` from
        a KV connector (another instance's cache); the rest is computed."""
        if num_external_cached_tokens and self.enabled:
            self._ev_external.append((len(self._ev_rid), num_external_cached_tokens))
            self._extended = True
        self._event(rid, EventKind.SCHEDULED, num_cached_tokens)

    def preempted(self, rid: int) -> None:
        """The request was preempted (its KV blocks freed, it goes back to waiting)."""
        self._event(rid, EventKind.PREEMPTED)

    def outputs(self, rids: Sequence[int] | np.ndarray, num_new_tokens: Sequence[int] | np.ndarray | int = 1) -> None:
        """Requests that produced `num_new_tokens` tokens this step (vectorised)."""
        if not self.enabled:
            return
        rid = np.asarray(rids, dtype=np.int64)
        if type(num_new_tokens) in (list, tuple) and num_new_tokens.count(1) == len(num_new_tokens) == len(rid):
            num_new_tokens = 1  # an engine's per-request counts, all ones (plain decode): no array work
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

    def spec_decode(self, num_drafts: int, num_draft_tokens: int, num_accepted_tokens: int,
                    accepted_per_pos: Sequence[int] = ()) -> None:
        """Speculative decoding this step (several calls in a step add up): drafts, draft tokens,
        accepted draft tokens, and per draft position the drafts accepted up to it (vLLM's
        `SpecDecodingStats`). Positions past `MAX_SPEC_POSITIONS` are not kept; the frontend
        counts such a step in `otel_llm.telemetry.dropped`."""
        if not self.enabled:
            return
        pos = list(accepted_per_pos[: MAX_SPEC_POSITIONS + 1])
        if self._spec is None:
            self._spec = [num_drafts, num_draft_tokens, num_accepted_tokens, pos]
            self._extended = True
            return
        spec = self._spec
        spec[0] += num_drafts
        spec[1] += num_draft_tokens
        spec[2] += num_accepted_tokens
        old = spec[3]
        spec[3] = [a + b for a, b in zip(old, pos)] + (old[len(pos):] if len(old) > len(pos) else pos[len(old):])

    def kv_evictions(self, evictions: KVEvictions | None) -> None:
        """This step's sampled KV block evictions (`KVResidencySampler.drain()`; None: none)."""
        if evictions is not None and self.enabled:
            self._kv = evictions if self._kv is None else KVEvictions(*map(np.concatenate, zip(self._kv, evictions)))
            self._extended = True

    def snapshot(self, snapshot: SchedulerSnapshot) -> None:
        """Attach the scheduler snapshot for this step (callers may throttle, e.g. 1 Hz)."""
        if self.enabled:
            self._snapshot = snapshot

    def lane(self, lane: StepLane) -> None:
        """Attach the step itself (the engine lane: `StepLane`)."""
        if self.enabled:
            self._lane = lane

    def end_step(self, num_computed_prompt_tokens: int = 0) -> StepRecord | None:
        """Close the step: one timestamp for all its outputs. Returns None when disabled."""
        if not self.enabled:
            return None
        ts = self._clock()
        spec = external = kv = None
        if self._extended:
            spec, external, kv = self._take_extension()
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
            spec,
            external,
            kv,
            self._lane,
        )
        self._reset()
        return rec

    def _take_extension(self) -> tuple[SpecDecodingStats | None, np.ndarray | None, KVEvictions | None]:
        """This step's spec decoding sums, per-event KV-connector hits and KV evictions (None: none); then reset."""
        spec = None if self._spec is None else SpecDecodingStats(*self._spec[:3], np.array(self._spec[3], np.int64))
        external = None
        if self._ev_external:
            external = np.zeros(len(self._ev_rid), np.int64)
            idx, tokens = zip(*self._ev_external)
            external[list(idx)] = tokens
        kv = self._kv
        self._spec, self._ev_external, self._kv, self._extended = None, [], None, False
        return spec, external, kv

    def end_step_bytes(self, num_computed_prompt_tokens: int = 0) -> bytes | None:
        """`end_step` serialised for a process boundary (None when disabled)."""
        if (self._all_one and len(self._out_rid) == 1 and not self._ev_rid and not self._fin_rid
                and self._snapshot is None and not self._extended):  # steady decode: no record built
            data = outputs_only_record(self._clock(), self.anchor_wall_ns, self.anchor_mono_ns,
                                       num_computed_prompt_tokens, self._out_rid[0], self._lane)
            self._out_rid, self._out_n, self._lane = [], [], None  # all that such a step filled (see `_reset`)
            return data
        rec = self.end_step(num_computed_prompt_tokens)
        return rec.to_bytes() if rec is not None else None
