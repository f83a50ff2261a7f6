"""The engine lane on the frontend: one engine's latest steps, as its records carried them.

Each step record with a lane (`otel_llm.engine.step.StepLane`: the step's start, forward time,
prefill and decode tokens, batch, scheduler state and why the queue waited) leaves it here. On the
step path that is the lane's bytes cut from the record and its end appended, not decoded; `fold` (every `FOLD_AT` steps,
and `flush` before every read, under the owner's lock) decodes the kept lanes at once with numpy,
drops the ones that cannot be true (counted), sums vLLM's MFU estimates (`flush` adds them to their
counters) and appends the rest to a window of the last `capacity` steps (at 100 steps/s the default
holds about 80 s).

The window is one contiguous run of a buffer twice its size, in step order, with running totals of
forward time and prefill tokens beside it: a request's summary (`summaries`: the steps it was in,
their forward time, the largest batch it shared, the prefill tokens of other requests computed
during its decode) is three binary searches and a few subtractions, for a whole batch of requests at once.
"""

from __future__ import annotations

import numpy as np

from otel_llm.canonical.instruments import PERF_COUNTERS
from otel_llm.canonical.metrics_state import MetricsState
from otel_llm.engine.step import HEADER_SIZE, LANE_DTYPE, LANE_SIZE, LANE_STRUCT, ForwardSource

DEFAULT_CAPACITY = 8192
FOLD_AT = 1024  # lanes kept undecoded at most
_LANE_UNPACK = LANE_STRUCT.unpack_from
_SCALAR_FOLD = 8  # up to this many kept lanes are folded one by one (numpy's per-call cost exceeds the work)
WINDOW_NS = 1_000_000_000  # an exported window of steps spans at most this long
WINDOW_STEPS = 256  # and holds at most this many
_NO_FORWARD = int(ForwardSource.NONE)  # (a plain int: numpy converts an enum member slowly)
_ESTIMATES = ("flops", "read_bytes", "write_bytes")  # vLLM's MFU estimates: summed into PERF_COUNTERS at `flush`
_COUNTS = ("forward_ns", "prefill_tokens", "decode_tokens", "num_requests", "running", "waiting", "preemptions",
           "flops", "read_bytes", "write_bytes")
# A lane as 4-byte words: those holding each count's sign bit (an 8-byte count's high word, little-endian),
# checked at once; as 8-byte words: the estimates' (summed at once).
_SIGN_WORDS = np.array([(LANE_DTYPE.fields[name][1] + LANE_DTYPE.fields[name][0].itemsize - 4) // 4
                        for name in _COUNTS], np.intp)
_ESTIMATE_WORDS = slice(LANE_DTYPE.fields["flops"][1] // 8, LANE_DTYPE.fields["write_bytes"][1] // 8 + 1)


class EngineLane:
    """The last `capacity` steps of one engine (engine monotonic ns). Single writer, under its owner's lock."""

    def __init__(self, metrics: MetricsState, capacity: int = DEFAULT_CAPACITY):
        self.metrics = metrics
        self.capacity = capacity
        self._raw = bytearray(2 * capacity * LANE_SIZE)  # the rows as the wire has them (one copy in `_fold_one`)
        self._lanes = np.frombuffer(self._raw, LANE_DTYPE)
        self._starts, self._batch = self._lanes["start_ns"], self._lanes["num_requests"]  # views, read per request
        self._ends = np.zeros(2 * capacity, np.int64)
        # running totals before each row (and, at `hi`, after the last): forward ns of measured steps, prefill tokens
        self._forward = np.zeros(2 * capacity + 1, np.int64)
        self._prefill = np.zeros(2 * capacity + 1, np.int64)
        self._lo = self._hi = 0  # the window: rows lo..hi-1
        self.total = 0  # steps kept, including those the window let go since
        self.dropped = 0  # lanes that could not be true
        self._pending: list[bytes] = []  # the lanes kept undecoded, as packed
        self._pending_ends: list[int] = []  # and the end ns of their steps
        self._last_end = 0  # end ns of the newest kept step
        self._forward_total = self._prefill_total = 0  # through it (`_forward[hi]`, `_prefill[hi]`)
        self._estimates = [0, 0, 0]  # summed by `fold`, added to the counters by `flush`
        self._window_first = 0  # end ns of the first step not exported yet (0: none)
        self.due = False  # a window of steps is due for export
        self._window_steps = 0
        self._exported_ns = 0  # end ns of the last step exported

    def add(self, end_ns: int, data: bytes, offset: int = HEADER_SIZE, idle: bool = False) -> None:
        """A step that ended at `end_ns` whose lane is packed in `data` at `offset` (a step record's bytes);
        `idle`: the engine has nothing left to run after it. Sets `due` when a window of steps should be
        exported (`take_window`): it is 1 s or 256 steps long, or the engine went idle."""
        self._pending.append(data[offset:offset + LANE_SIZE])
        self._pending_ends.append(end_ns)
        if len(self._pending) >= FOLD_AT:
            self.fold()
        if not self._window_first:
            self._window_first = end_ns
        self._window_steps += 1
        self.due = idle or self._window_steps >= WINDOW_STEPS or end_ns - self._window_first >= WINDOW_NS

    def take_window(self) -> dict[str, np.ndarray] | None:
        """The kept steps not exported yet (`columns`), and they count as exported; None when there are none."""
        self.fold()
        cols = self.columns(self._exported_ns)
        self._window_first = self._window_steps = 0
        self.due = False
        if not len(cols["end_ns"]):
            return None
        self._exported_ns = int(cols["end_ns"][-1])
        return cols

    def fold(self) -> None:
        """Decode the kept lanes: check them, sum the estimates, append them to the window."""
        if not self._pending:
            return
        pending, ends, self._pending, self._pending_ends = self._pending, self._pending_ends, [], []
        if len(pending) <= _SCALAR_FOLD:  # a tracer's read at every finish: a step or two each time
            for end, lane in zip(ends, pending):
                self._fold_one(end, lane)
            return
        raw = b"".join(pending)
        lanes = np.frombuffer(raw, LANE_DTYPE)
        words = np.frombuffer(raw, "<i4").reshape(len(pending), LANE_SIZE // 4)
        ends = np.array(ends, np.int64)
        kv = lanes["kv_usage"]
        ok = (words[:, _SIGN_WORDS] >= 0).all(axis=1) & (lanes["start_ns"] <= ends) & (kv >= 0.0) & (kv <= 1.0)
        ok[0] &= ends[0] >= self._last_end  # in order, after the last kept step
        ok[1:] &= ends[1:] >= ends[:-1]
        if not ok.all():
            self.dropped += int(np.count_nonzero(~ok))
            lanes, ends, words, raw = lanes[ok], ends[ok], words[ok], None
        for k, total in enumerate(words.view("<i8")[:, _ESTIMATE_WORDS].sum(axis=0).tolist()):
            self._estimates[k] += total
        self._append(lanes, ends, raw)

    def flush(self) -> None:
        """`fold`, then add the estimates summed since the last flush to their counters (before a read)."""
        self.fold()
        if any(self._estimates):  # (vLLM skips an all-zero step: adding 0 is the same)
            for counter, total in zip(PERF_COUNTERS, self._estimates):
                self.metrics.add(counter, total)
            self._estimates = [0, 0, 0]

    def _fold_one(self, end: int, lane: bytes) -> None:
        """`fold` for one lane, in plain Python (the same checks, sums and append)."""
        start, forward, prefill, decode, requests, running, waiting, preempted, kv, flops, read, write, _, source = \
            _LANE_UNPACK(lane)
        if (start > end or end < self._last_end or not 0.0 <= kv <= 1.0
                or min(forward, prefill, decode, requests, running, waiting, preempted, flops, read, write) < 0):
            self.dropped += 1
            return
        if flops or read or write:
            e = self._estimates
            e[0] += flops
            e[1] += read
            e[2] += write
        if self._hi + 1 > 2 * self.capacity:
            self._move(1)
        hi = self._hi
        self._raw[hi * LANE_SIZE:(hi + 1) * LANE_SIZE] = lane
        self._ends[hi] = self._last_end = end
        self._forward_total += forward if source else 0
        self._prefill_total += prefill
        self._forward[hi + 1] = self._forward_total
        self._prefill[hi + 1] = self._prefill_total
        self._hi = hi + 1
        if self._hi - self._lo > self.capacity:
            self._lo += 1
        self.total += 1

    def _move(self, n: int) -> None:
        """Make room for `n` rows: the window's newest rows (those that stay) to the buffer's front."""
        keep = min(self._hi - self._lo, self.capacity - n)
        for a in (self._lanes, self._ends):
            a[:keep] = a[self._hi - keep:self._hi]
        for a in (self._forward, self._prefill):
            a[:keep + 1] = a[self._hi - keep:self._hi + 1]
        self._lo, self._hi = 0, keep

    def _append(self, lanes: np.ndarray, ends: np.ndarray, raw: bytes | None = None) -> None:
        """Append checked lanes to the window (`raw`: the same lanes' bytes, copied faster than the rows)."""
        n, cap = len(lanes), self.capacity
        self.total += n
        if n > cap:
            lanes, ends, n, raw = lanes[-cap:], ends[-cap:], cap, None
        forward = lanes["forward_ns"] * (lanes["forward_source"] != _NO_FORWARD)  # measured steps only
        if self._hi + n > 2 * cap:
            self._move(n)
        hi, rows = self._hi, slice(self._hi, self._hi + n)
        if raw is None:
            self._lanes[rows] = lanes
        else:
            self._raw[hi * LANE_SIZE:(hi + n) * LANE_SIZE] = raw
        self._ends[rows] = ends
        for totals, column in ((self._forward, forward), (self._prefill, lanes["prefill_tokens"])):
            after = totals[hi + 1:hi + n + 1]
            np.cumsum(column, out=after)
            after += totals[hi]
        self._hi += n
        if n:
            self._last_end = int(ends[-1])
            self._forward_total, self._prefill_total = int(self._forward[self._hi]), int(self._prefill[self._hi])
        self._lo = max(self._lo, self._hi - cap)

    def columns(self, since_ns: int = 0) -> dict[str, np.ndarray]:
        """The kept steps that ended after `since_ns`, oldest first: `end_ns` and each `StepLane` field, an array each
        (fields of one copy of the rows, in the lane's dtypes). Call `fold` first."""
        ends = self._ends[self._lo:self._hi]
        rows = slice(self._lo + int(np.searchsorted(ends, since_ns, "right")), self._hi)
        lanes = np.frombuffer(self._raw[rows.start * LANE_SIZE:rows.stop * LANE_SIZE], LANE_DTYPE)  # (a copy)
        out = {"end_ns": self._ends[rows].copy()}
        out.update((name, lanes[name]) for name in LANE_DTYPE.names)
        return out

    def summaries(self, sched: np.ndarray, first: np.ndarray, last: np.ndarray) -> dict[str, np.ndarray] | None:
        """Per request (engine ns of its first scheduling, first and last token; 0 = none), from the
        steps that ended from its scheduling to its last token: `steps`, `forward_ns` (of the measured
        ones), `max_batch` (the most requests in one of them) and `interfering_prefill_tokens` (prompt
        tokens computed in the steps after its first token: other requests' prefills, and its own
        recomputation after a preemption). `covered`: the window still held its first step (where
        False, or it never ran, the summary is zeros). Each a sequence indexed like the arguments (numpy
        arrays; lists for one request). None when no step was kept."""
        self.fold()
        lo, hi = self._lo, self._hi
        if hi == lo:
            return None
        if len(sched) == 1:
            return self._summary(int(sched[0]), int(first[0]), int(last[0]))
        ends = self._ends[lo:hi]
        covered = (sched > 0) & (last >= sched) & (sched >= self._lanes["start_ns"][lo])  # holds its first step
        i0 = np.where(covered, ends.searchsorted(sched, "left"), 0)
        i1 = np.where(covered, ends.searchsorted(last, "right"), 0)
        j0 = np.maximum(ends.searchsorted(first, "right"), i0)  # the steps after the one of its first token
        max_batch = self._max_batch(i0, i1)
        return {"steps": i1 - i0, "forward_ns": self._forward[lo + i1] - self._forward[lo + i0],
                "max_batch": max_batch, "interfering_prefill_tokens": np.where(
                    i1 > j0, self._prefill[lo + i1] - self._prefill[lo + np.minimum(j0, i1)], 0),
                "covered": covered}

    def _max_batch(self, i0: np.ndarray, i1: np.ndarray) -> np.ndarray:
        """The most requests in one step of each window range [i0, i1) (0 for an empty one). From
        `_SCALAR_FOLD` ranges on, one `reduceat` over the ranges interleaved with the gaps between
        them (a fold of 32 requests: a tenth of the time of a max per range)."""
        lo, hi = self._lo, self._hi
        if len(i0) < _SCALAR_FOLD:
            return np.array([int(self._batch[lo + a:lo + b].max()) if b > a else 0
                             for a, b in zip(i0.tolist(), i1.tolist())], np.int64)
        # reduceat's indices must lie inside its array, and a range may end at the window's end: one row more
        rows = self._batch[lo:hi + 1] if hi < len(self._batch) else np.append(self._batch[lo:hi], 0)
        bounds = np.empty(2 * len(i0), np.intp)
        bounds[0::2], bounds[1::2] = i0, i1
        maxima = np.maximum.reduceat(rows, bounds)[0::2]  # (odd ranges: the gaps, unread)
        return np.where(i1 > i0, maxima, 0).astype(np.int64)

    def _summary(self, sched: int, first: int, last: int) -> dict[str, list]:
        """`summaries` of one request, in plain Python (a tracer's: one request per finish)."""
        lo, hi = self._lo, self._hi
        if not (0 < sched <= last and sched >= self._starts[lo]):
            return {"steps": [0], "forward_ns": [0], "max_batch": [0], "interfering_prefill_tokens": [0],
                    "covered": [False]}
        ends = self._ends[lo:hi]
        i0 = int(ends.searchsorted(sched, "left"))
        i1 = hi - lo if last >= self._ends[hi - 1] else int(ends.searchsorted(last, "right"))  # usually the newest
        j0 = min(max(int(ends.searchsorted(first, "right")), i0), i1)
        batch = int(self._batch[lo + i0:lo + i1].max()) if i1 > i0 else 0
        interfering = int(self._prefill[lo + i1] - self._prefill[lo + j0])
        return {"steps": [i1 - i0], "forward_ns": [int(self._forward[lo + i1] - self._forward[lo + i0])],
                "max_batch": [batch], "interfering_prefill_tokens": [interfering], "covered": [True]}
