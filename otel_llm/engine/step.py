"""The per-step record: what the engine hands to the frontend once per scheduler step.

A `StepRecord` is columnar. It crosses a process boundary as one `bytes` object
(`to_bytes` / `from_bytes`) made of a fixed header followed by flat arrays, so no
per-token Python object is ever pickled or built. Layout (little endian):

    header  (struct `_HEADER`):
        magic u32, version u16, flags u16 (1: snapshot, 2: every output is 1 token, 4: extension, 8: lane),
        step_ts_ns i64, anchor_wall_ns i64, anchor_mono_ns i64, num_computed_prompt_tokens i64, n_events u32,
        n_outputs u32, n_finished u32,
        snapshot: running i32, waiting i32, kv_usage f64, prefix_queries i64,
                  prefix_hits i64, preemptions i64
    lane     (only with flag 8; struct `_LANE`, fixed size `LANE_SIZE`, see `StepLane`)
    events   : rid i64[n_events], ts_ns i64[n_events], value i64[n_events], kind u8[n_events]
    outputs  : rid i64[n_outputs], num_new_tokens i32[n_outputs] (absent when flag 2 says all are 1)
    finished : rid i64[n_finished], max_seq_tokens i32[n_finished], reason u8[n_finished]
    extension (only with flag 4; struct `_EXTENSION`):
        waiting_deferred i32, external_prefix_queries i64, external_prefix_hits i64,
        spec_num_drafts i64, spec_num_draft_tokens i64, spec_num_accepted_tokens i64,
        parts u16 (1: spec decoding, 2: event_external, 4: KV evictions), n_positions u16
        spec accepted per position i64[n_positions]
        event_external i64[n_events] (part 2: external KV-connector hit tokens per event)
        part 4: n_evicted u32, n_gaps u32, lifetime_ns i64[n_evicted], idle_ns i64[n_evicted],
                reuse_gap_ns i64[n_gaps] (sampled KV blocks evicted this step, `kv_residency.py`)

`max_seq_tokens` is the longest sequence's generation length for a request with
n > 1 parallel sequences (0: the request has one sequence). `rid` is the request handle the frontend allocated (`Telemetry.arrival`). All
timestamps are the engine process's `time.monotonic_ns()`; the anchor is one
(`time.time_ns()`, `time.monotonic_ns()`) pair taken when that process's recorder
started, so the frontend can turn engine timestamps into epoch ns for spans. The snapshot counters
`prefix_queries`, `prefix_hits` and `preemptions` (and the extension's `external_prefix_*`) are deltas
since the previous snapshot (tokens, tokens, requests); the extension's first three fields are the
snapshot's and count only with flag 1. The spec decoding sums are this step's.

The lane (`StepLane`) is the step itself as the engine lane shows it: when it started, its forward
pass, its tokens and batch, and the scheduler's state after it. Fixed-size and right after the header,
so the steady decode step keeps its fast path with it (`outputs_only_header` gives its offset).

The extension carries what only some engines have (deferred waiting requests, a KV
connector's prefix cache, speculative decoding, sampled KV block residency). It is written only when there is
some, so a record without it is byte for byte the original format, and the steady
decode step (flags == 2, see `outputs_only_header`) never has one.

Size: one wire format: the layout, the encoder, the decoder and the steady step's fast path must agree
byte for byte, so they are one file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from otel_llm.engine.kv_residency import KVEvictions

_MAGIC = 0x4C4C4F54  # "TOLL"
_VERSION = 1
_HEADER = struct.Struct("<IHHqqqqIIIiidqqq")
_PREFIX = struct.Struct("<IHHqqqqIII")  # the header up to the counts
_EXTENSION = struct.Struct("<iqqqqqHH")
_KV_COUNTS = struct.Struct("<II")
_LANE = struct.Struct("<qqiiiiiidqqqBBxxxxxx")
HEADER_SIZE = _HEADER.size
LANE_SIZE = _LANE.size
LANE_STRUCT = _LANE
# The lane's bytes as a numpy record (readers decode many at once); fields as `StepLane`'s.
LANE_DTYPE = np.dtype({"names": ["start_ns", "forward_ns", "prefill_tokens", "decode_tokens", "num_requests", "running",
                                 "waiting", "preemptions", "kv_usage", "flops", "read_bytes", "write_bytes", "blocked",
                                 "forward_source"],
                       "formats": ["<i8", "<i8", "<i4", "<i4", "<i4", "<i4", "<i4", "<i4", "<f8", "<i8", "<i8", "<i8",
                                   "u1", "u1"],
                       "offsets": [0, 8, 16, 20, 24, 28, 32, 36, 40, 48, 56, 64, 72, 73], "itemsize": _LANE.size})
_SNAPSHOT, _ALL_ONE, _EXTENDED, _HAS_LANE = 1, 2, 4, 8  # header flags
_SPEC_PART, _EXTERNAL_PART, _KV_PART = 1, 2, 4  # extension parts
MAX_SPEC_POSITIONS = 16  # draft positions kept per step (the `otel_llm.spec_decode.position` vocabulary)
_WIRE_POSITIONS = MAX_SPEC_POSITIONS + 1  # one past the bound travels, so the frontend can count the overflow
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
    waiting_deferred: int = 0  # of `waiting`, deferred (LoRA budget, KV transfer, blocked); the rest wait for capacity
    external_prefix_queries: int = 0  # tokens queried through the KV connector (cross-instance cache)
    external_prefix_hits: int = 0  # tokens hit through the KV connector


class SpecDecodingStats(NamedTuple):
    """One step's speculative decoding, summed over its requests (vLLM's `SpecDecodingStats`):
    drafts proposed, draft tokens, accepted draft tokens, and accepted tokens per draft position
    (int64[k]; position i counts drafts whose first i+1 tokens were accepted)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: np.ndarray


class Blocked(IntEnum):
    """Why the head of the waiting queue was not scheduled in a step (the lane's `blocked`)."""

    NONE = 0  # nothing waits, or everything waiting was scheduled
    SLOTS = 1  # the batch is full (max_num_seqs)
    KV = 2  # not enough free KV-cache blocks
    TOKENS = 3  # the step's token budget (max_num_batched_tokens) is spent
    OTHER = 4  # deferred (LoRA budget, KV transfer) or unknown


class ForwardSource(IntEnum):
    """What measured a lane's `forward_ns`."""

    NONE = 0  # not measured (forward_ns is 0)
    HOST = 1  # host time of the forward call (CPU)
    CUDA = 2  # device time between two CUDA events, read after the step's own sync


class StepLane(NamedTuple):
    """One engine step as the engine lane shows it. Times are the engine's monotonic ns; the step
    ends at the record's `step_ts_ns`. `flops`, `read_bytes`, `write_bytes`: vLLM 0.32's per-GPU
    estimates (`vllm/v1/metrics/perf.py`; 0 when the engine does not estimate them)."""

    start_ns: int
    forward_ns: int
    prefill_tokens: int  # prompt (and recomputed) tokens computed this step
    decode_tokens: int  # tokens computed by decoding sequences
    num_requests: int  # requests in the batch
    running: int  # after the step
    waiting: int
    preemptions: int  # requests preempted this step
    kv_usage: float  # 0..1, after the step
    flops: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    blocked: int = Blocked.NONE
    forward_source: int = ForwardSource.NONE

    def pack(self) -> bytes:
        return _LANE.pack(*self)

    @classmethod
    def unpack_from(cls, data, offset: int = HEADER_SIZE) -> "StepLane":
        return tuple.__new__(cls, _LANE.unpack_from(data, offset))  # (as `_make`, without its length check)


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
    spec_decoding: SpecDecodingStats | None = None
    event_external: np.ndarray | None = None  # int64 per event: KV-connector hit tokens for SCHEDULED; None: all 0
    kv_evictions: KVEvictions | None = None  # sampled KV blocks evicted this step (--kv-cache-metrics)
    lane: StepLane | None = None  # the step itself (the engine lane)

    def to_bytes(self) -> bytes:
        s = self.snapshot
        n_out = len(self.output_rid)
        flags = (s is not None) | (self.outputs_all_one << 1) | (_HAS_LANE if self.lane is not None else 0)
        if self.spec_decoding is not None or self.event_external is not None or self.kv_evictions is not None or (
                s is not None and
                (s.waiting_deferred or s.external_prefix_queries or s.external_prefix_hits)):
            flags |= _EXTENDED
        header = _HEADER.pack(
            _MAGIC, _VERSION, flags, self.step_ts_ns,
            self.anchor_wall_ns, self.anchor_mono_ns, self.num_computed_prompt_tokens,
            len(self.event_rid), n_out, len(self.finished_rid),
            *((s.running, s.waiting, s.kv_usage, s.prefix_queries, s.prefix_hits, s.preemptions)
              if s is not None else (0, 0, 0.0, 0, 0, 0)),
        )
        parts = [header] if self.lane is None else [header, self.lane.pack()]
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
        if flags & _EXTENDED:
            parts += self._extension()
        return b"".join(parts)

    def _extension(self) -> list:
        s, sd, ext, kv = self.snapshot, self.spec_decoding, self.event_external, self.kv_evictions
        spec = (sd.num_drafts, sd.num_draft_tokens, sd.num_accepted_tokens) if sd is not None else (0, 0, 0)
        pos = np.asarray(sd.accepted_per_pos, np.int64)[:_WIRE_POSITIONS] if sd is not None else _EMPTY["<i8"]
        has_ext = ext is not None and len(self.event_rid) > 0
        parts = [_EXTENSION.pack(
            *((s.waiting_deferred, s.external_prefix_queries, s.external_prefix_hits) if s is not None else (0, 0, 0)),
            *spec, (_SPEC_PART if sd is not None else 0) | (_EXTERNAL_PART if has_ext else 0)
            | (_KV_PART if kv is not None else 0), len(pos))]
        if len(pos):
            parts.append(_raw(pos, "<i8"))
        if has_ext:
            parts.append(_raw(ext, "<i8"))
        if kv is not None:
            n = min(len(kv.lifetime_ns), len(kv.idle_ns))
            parts += [_KV_COUNTS.pack(n, len(kv.reuse_gap_ns)), _raw(kv.lifetime_ns[:n], "<i8"),
                      _raw(kv.idle_ns[:n], "<i8"), _raw(kv.reuse_gap_ns, "<i8")]
        return parts

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> "StepRecord":
        """Decode without copying the arrays. Raises ValueError on a malformed record."""
        if len(data) < _HEADER.size:
            raise ValueError(f"step record too short: {len(data)} bytes")
        (magic, version, flags, step_ts, a_wall, a_mono, n_prompt, n_ev, n_out, n_fin,
         running, waiting, kv, pq, ph, pre) = _HEADER.unpack_from(data, 0)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"not a step record (magic {magic:#x}, version {version})")
        all_one = bool(flags & _ALL_ONE)
        off = _HEADER.size + (_LANE.size if flags & _HAS_LANE else 0)
        if len(data) < off:
            raise ValueError(f"step record too short for its lane: {len(data)} bytes")
        expected = off + n_ev * 25 + n_out * (8 if all_one else 12) + n_fin * 13
        ext = None
        if flags & _EXTENDED:
            if len(data) < expected + _EXTENSION.size:
                raise ValueError(f"step record is {len(data)} bytes, its extension starts at {expected}")
            ext = _EXTENSION.unpack_from(data, expected)
            parts, n_pos = ext[-2:]
            if parts & ~(_SPEC_PART | _EXTERNAL_PART | _KV_PART) or (n_pos and not parts & _SPEC_PART):
                raise ValueError(f"step record extension: bad parts {parts:#x} with {n_pos} positions")
            ext_at = expected + _EXTENSION.size
            expected = ext_at + 8 * n_pos + (8 * n_ev if parts & _EXTERNAL_PART else 0)
            if parts & _KV_PART:
                if len(data) < expected + _KV_COUNTS.size:
                    raise ValueError(f"step record is {len(data)} bytes, its KV evictions start at {expected}")
                kv_at = expected + _KV_COUNTS.size
                n_kv, n_gaps = _KV_COUNTS.unpack_from(data, expected)
                expected = kv_at + 16 * n_kv + 8 * n_gaps
        if len(data) != expected:
            raise ValueError(f"step record is {len(data)} bytes, header says {expected}")
        lane = StepLane.unpack_from(data) if flags & _HAS_LANE else None
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
        spec = ev_ext = kv_ev = None
        if ext is None:
            snapshot = SchedulerSnapshot(running, waiting, kv, pq, ph, pre) if flags & _SNAPSHOT else None
        else:
            deferred, ext_q, ext_h, drafts, draft_tokens, accepted, parts, n_pos = ext
            snapshot = SchedulerSnapshot(running, waiting, kv, pq, ph, pre, deferred, ext_q, ext_h) \
                if flags & _SNAPSHOT else None
            if parts & _SPEC_PART:
                pos = np.frombuffer(data, "<i8", n_pos, ext_at) if n_pos else _EMPTY["<i8"]
                spec = SpecDecodingStats(drafts, draft_tokens, accepted, pos)
            if parts & _EXTERNAL_PART:
                ev_ext = np.frombuffer(data, "<i8", n_ev, ext_at + 8 * n_pos) if n_ev else _EMPTY["<i8"]
            if parts & _KV_PART:
                arrays = np.frombuffer(data, "<i8", 2 * n_kv + n_gaps, kv_at)
                kv_ev = KVEvictions(arrays[:n_kv], arrays[n_kv:2 * n_kv], arrays[2 * n_kv:])
        return cls(
            step_ts, a_wall, a_mono, n_prompt, ev_rid, ev_ts, ev_val, ev_kind, out_rid, out_n,
            fin_rid, fin_reason, fin_max, snapshot, all_one, spec, ev_ext, kv_ev, lane,
        )


def outputs_only_record(step_ts_ns: int, anchor_wall_ns: int, anchor_mono_ns: int, num_computed_prompt_tokens: int,
                        output_rid: np.ndarray, lane: StepLane | None = None) -> bytes:
    """`StepRecord.to_bytes` of a step holding only single-token outputs `output_rid` (no events,
    finishes, snapshot or extension; a lane or not): the steady decode step, encoded without building
    a record."""
    header = _HEADER.pack(_MAGIC, _VERSION, _ALL_ONE if lane is None else _ALL_ONE | _HAS_LANE, step_ts_ns,
                          anchor_wall_ns, anchor_mono_ns, num_computed_prompt_tokens, 0, len(output_rid), 0,
                          0, 0, 0.0, 0, 0, 0)
    if lane is None:
        return b"".join((header, _raw(output_rid, "<i8")))
    return b"".join((header, _LANE.pack(*lane), _raw(output_rid, "<i8")))


def outputs_only_header(data: bytes) -> tuple[int, int, int, int, int] | None:
    """(step_ts_ns, anchor_wall_ns, anchor_mono_ns, num_computed_prompt_tokens, body offset) when
    `data` is a record holding only single-token outputs (and maybe a lane, then at `HEADER_SIZE`),
    so that its body, from the offset on, is exactly the output rid bytes; None otherwise (then decode
    it with `StepRecord.from_bytes`)."""
    if len(data) < _HEADER.size:
        return None
    magic, version, flags, ts, wall, mono, n_prompt, n_ev, n_out, n_fin = _PREFIX.unpack_from(data, 0)
    body = _HEADER.size if flags == _ALL_ONE else _HEADER.size + _LANE.size if flags == _ALL_ONE | _HAS_LANE else 0
    if magic != _MAGIC or version != _VERSION or not body or n_ev or n_fin or len(data) != body + 8 * n_out:
        return None
    return ts, wall, mono, n_prompt, body


def _raw(arr: np.ndarray, dtype: str):
    """A contiguous little-endian buffer of `arr` (no copy when it already is one)."""
    return memoryview(np.ascontiguousarray(arr, dtype=dtype))


_ONES = np.ones(4096, np.int32)
_ONES.flags.writeable = False


def ones_i4(n: int) -> np.ndarray:
    """n int32 ones (a read-only view for common sizes)."""
    return _ONES[:n] if n <= len(_ONES) else np.ones(n, np.int32)
