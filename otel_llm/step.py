"""The per-step record: what the engine hands to the frontend once per scheduler step.

A `StepRecord` is columnar. It crosses a process boundary as one `bytes` object
(`to_bytes` / `from_bytes`) made of a fixed header followed by flat arrays, so no
per-token Python object is ever pickled or built. Layout (little endian):

    header  (struct `_HEADER`):
        magic u32, version u16, flags u16 (1: snapshot, 2: every output is 1 token), step_ts_ns i64,
        anchor_wall_ns i64, anchor_mono_ns i64, num_computed_prompt_tokens i64, n_events u32, n_outputs u32, n_finished u32,
        snapshot: running i32, waiting i32, kv_usage f64, prefix_queries i64,
                  prefix_hits i64, preemptions i64
    events   : rid i64[n_events], ts_ns i64[n_events], value i64[n_events], kind u8[n_events]
    outputs  : rid i64[n_outputs], num_new_tokens i32[n_outputs] (absent when flag 2 says all are 1)
    finished : rid i64[n_finished], max_seq_tokens i32[n_finished], reason u8[n_finished]

`max_seq_tokens` is the longest sequence's generation length for a request with
n > 1 parallel sequences (0: the request has one sequence). `rid` is the request handle the frontend allocated (`Telemetry.arrival`). All
timestamps are the engine process's `time.monotonic_ns()`; the anchor is one
(`time.time_ns()`, `time.monotonic_ns()`) pair taken when that process's recorder
started, so the frontend can turn engine timestamps into epoch ns for spans. The snapshot counters
`prefix_queries`, `prefix_hits` and `preemptions` are deltas since the previous
snapshot (tokens, tokens, requests).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import numpy as np

_MAGIC = 0x4C4C4F54  # "TOLL"
_VERSION = 1
_HEADER = struct.Struct("<IHHqqqqIIIiidqqq")
_PREFIX = struct.Struct("<IHHqqqqIII")  # the header up to the counts
HEADER_SIZE = _HEADER.size
_EMPTY = {d: np.zeros(0, d) for d in ("<i8", "<i4", "u1")}


class EventKind(IntEnum):
    """Request lifecycle events, vLLM v1 `EngineCoreEventType` numbering."""

    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


class FinishReason(IntEnum):
    """Why a request finished; the strings are vLLM's `FINISH_REASON_STRINGS`."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4  # vLLM >= 0.32: a repetitive token pattern was detected

    @property
    def label(self) -> str:
        return self.name.lower()


FINISH_REASON_LABELS = tuple(r.label for r in FinishReason)


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Scheduler state after a step. Counters are deltas since the last snapshot."""

    running: int
    waiting: int
    kv_usage: float  # 0..1
    prefix_queries: int = 0  # tokens
    prefix_hits: int = 0  # tokens
    preemptions: int = 0  # requests


class StepRecord(NamedTuple):
    """One engine step, columnar. Arrays are read-only views when decoded from bytes.

    A NamedTuple rather than a frozen dataclass: it is built once per engine step
    on the token path, and tuple construction is several times cheaper.
    """

    step_ts_ns: int
    anchor_wall_ns: int
    anchor_mono_ns: int
    num_computed_prompt_tokens: int
    event_rid: np.ndarray  # int64
    event_ts_ns: np.ndarray  # int64
    event_value: np.ndarray  # int64: cached prompt tokens for SCHEDULED, else 0
    event_kind: np.ndarray  # uint8, EventKind
    output_rid: np.ndarray  # int64
    output_num_tokens: np.ndarray  # int32
    finished_rid: np.ndarray  # int64
    finished_reason: np.ndarray  # uint8, FinishReason
    finished_max_seq_tokens: np.ndarray  # int32, 0 when n == 1
    snapshot: SchedulerSnapshot | None = None
    outputs_all_one: bool = False  # every output_num_tokens is 1 (lets the frontend skip a check)

    def to_bytes(self) -> bytes:
        s = self.snapshot
        n_out = len(self.output_rid)
        header = _HEADER.pack(
            _MAGIC, _VERSION, (s is not None) | (self.outputs_all_one << 1), self.step_ts_ns,
            self.anchor_wall_ns, self.anchor_mono_ns, self.num_computed_prompt_tokens,
            len(self.event_rid), n_out, len(self.finished_rid),
            *((s.running, s.waiting, s.kv_usage, s.prefix_queries, s.prefix_hits, s.preemptions)
              if s is not None else (0, 0, 0.0, 0, 0, 0)),
        )
        parts = [header]
        if len(self.event_rid):
            parts += [_raw(self.event_rid, "<i8"), _raw(self.event_ts_ns, "<i8"), _raw(self.event_value, "<i8"),
                      _raw(self.event_kind, "u1")]
        if n_out:
            parts.append(_raw(self.output_rid, "<i8"))
            if not self.outputs_all_one:  # all ones: implied by the flag, not sent
                parts.append(_raw(self.output_num_tokens, "<i4"))
        if len(self.finished_rid):
            parts += [_raw(self.finished_rid, "<i8"), _raw(self.finished_max_seq_tokens, "<i4"),
                      _raw(self.finished_reason, "u1")]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> "StepRecord":
        """Decode without copying the arrays. Raises ValueError on a malformed record."""
        if len(data) < _HEADER.size:
            raise ValueError(f"step record too short: {len(data)} bytes")
        (magic, version, flags, step_ts, a_wall, a_mono, n_prompt, n_ev, n_out, n_fin,
         running, waiting, kv, pq, ph, pre) = _HEADER.unpack_from(data, 0)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"not a step record (magic {magic:#x}, version {version})")
        all_one = bool(flags & 2)
        expected = _HEADER.size + n_ev * 25 + n_out * (8 if all_one else 12) + n_fin * 13
        if len(data) != expected:
            raise ValueError(f"step record is {len(data)} bytes, header says {expected}")
        off = _HEADER.size
        if n_ev:
            ev_rid, ev_ts, ev_val = np.frombuffer(data, "<i8", 3 * n_ev, off).reshape(3, n_ev)
            ev_kind = np.frombuffer(data, "u1", n_ev, off + 24 * n_ev)
            off += 25 * n_ev
        else:
            ev_rid = ev_ts = ev_val = _EMPTY["<i8"]
            ev_kind = _EMPTY["u1"]
        out_rid, out_n = _EMPTY["<i8"], _EMPTY["<i4"]
        if n_out:
            out_rid = np.frombuffer(data, "<i8", n_out, off)
            off += 8 * n_out
            if all_one:
                out_n = ones_i4(n_out)
            else:
                out_n = np.frombuffer(data, "<i4", n_out, off)
                off += 4 * n_out
        fin_rid, fin_max, fin_reason = _EMPTY["<i8"], _EMPTY["<i4"], _EMPTY["u1"]
        if n_fin:
            fin_rid = np.frombuffer(data, "<i8", n_fin, off)
            fin_max = np.frombuffer(data, "<i4", n_fin, off + 8 * n_fin)
            fin_reason = np.frombuffer(data, "u1", n_fin, off + 12 * n_fin)
        return cls(
            step_ts, a_wall, a_mono, n_prompt, ev_rid, ev_ts, ev_val, ev_kind, out_rid, out_n,
            fin_rid, fin_reason, fin_max,
            SchedulerSnapshot(running, waiting, kv, pq, ph, pre) if flags & 1 else None,
            all_one,
        )


def outputs_only_header(data: bytes) -> tuple[int, int, int, int] | None:
    """(step_ts_ns, anchor_wall_ns, anchor_mono_ns, num_computed_prompt_tokens) when `data` is a
    record holding only single-token outputs, so that its body is exactly the output rid bytes;
    None otherwise (then decode it with `StepRecord.from_bytes`)."""
    if len(data) < _HEADER.size:
        return None
    magic, version, flags, ts, wall, mono, n_prompt, n_ev, n_out, n_fin = _PREFIX.unpack_from(data, 0)
    if (magic != _MAGIC or version != _VERSION or flags != 2 or n_ev or n_fin
            or len(data) != _HEADER.size + 8 * n_out):
        return None
    return ts, wall, mono, n_prompt


def _raw(arr: np.ndarray, dtype: str):
    """A contiguous little-endian buffer of `arr` (no copy when it already is one)."""
    return memoryview(np.ascontiguousarray(arr, dtype=dtype))


_ONES = np.ones(4096, np.int32)
_ONES.flags.writeable = False


def ones_i4(n: int) -> np.ndarray:
    """n int32 ones (a read-only view for common sizes)."""
    return _ONES[:n] if n <= len(_ONES) else np.ones(n, np.int32)
