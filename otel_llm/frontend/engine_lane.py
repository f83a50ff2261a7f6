"""The engine lane on the frontend: one engine's latest steps, as its records carried them.

Each step record with a lane (`otel_llm.engine.step.StepLane`: the step's start, forward time,
prefill and decode tokens, batch, scheduler state and why the queue waited) leaves it here. On the
step path that is one list append of the record's bytes, not decoded; `fold` (every `FOLD_AT` steps
and before every read, under the owner's lock) decodes the kept lanes at once with numpy, drops the
ones that cannot be true (counted), sums vLLM's MFU estimates into their counters and appends the
rest to a window of the last `capacity` steps (at 100 steps/s the default holds about 80 s).

The window is one contiguous run of a buffer twice its size, in step order, with running totals of
forward time and prefill tokens beside it: a request's summary (`summaries`: the steps it was in,
their forward time, the largest batch it shared, the prefill tokens of other requests computed
during its decode) is two binary searches and two subtractions, for a whole batch of requests at once.
"""

from __future__ import annotations

import numpy as np

from otel_llm.canonical.metrics_state import MetricsState
from otel_llm.engine.step import HEADER_SIZE, LANE_DTYPE, LANE_SIZE, ForwardSource

DEFAULT_CAPACITY = 8192
FOLD_AT = 1024  # lanes kept undecoded at most
COLUMNS = ("end_ns", *LANE_DTYPE.names)
_ESTIMATES = (("flops", "otel_llm.engine.estimated_flops"), ("read_bytes", "otel_llm.engine.estimated_read_bytes"),
              ("write_bytes", "otel_llm.engine.estimated_write_bytes"))
_COUNTS = ("forward_ns", "prefill_tokens", "decode_tokens", "num_requests", "running", "waiting", "preemptions",
           "flops", "read_bytes", "write_bytes")


class EngineLane:
    """The last `capacity` steps of one engine (engine monotonic ns). Single writer, under its owner's lock."""

    def __init__(self, metrics: MetricsState, capacity: int = DEFAULT_CAPACITY):
        self.metrics = metrics
        self.capacity = capacity
        self._lanes = np.zeros(2 * capacity, LANE_DTYPE)
        self._ends = np.zeros(2 * capacity, np.int64)
        # running totals before each row (and, at `hi`, after the last): forward ns of measured steps, prefill tokens
        self._forward = np.zeros(2 * capacity + 1, np.int64)
        self._prefill = np.zeros(2 * capacity + 1, np.int64)
        self._lo = self._hi = 0  # the window: rows lo..hi-1
        self.total = 0  # steps kept, including those the window let go since
        self.dropped = 0  # lanes that could not be true
        self._pending: list[tuple[int, bytes, int]] = []  # (end ns, bytes, offset of the lane)

    def add(self, end_ns: int, data: bytes, offset: int = HEADER_SIZE) -> None:
        """A step that ended at `end_ns` whose lane is packed in `data` at `offset` (a step record's bytes)."""
        self._pending.append((end_ns, data, offset))
        if len(self._pending) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Decode the kept lanes: check them, sum the estimates, append them to the window."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        lanes = np.frombuffer(b"".join(d[o:o + LANE_SIZE] for _, d, o in pending), LANE_DTYPE)
        ends = np.fromiter((e for e, _, _ in pending), np.int64, len(pending))
        ok = (lanes["start_ns"] <= ends) & (lanes["kv_usage"] >= 0.0) & (lanes["kv_usage"] <= 1.0)
        for name in _COUNTS:
            ok &= lanes[name] >= 0
        if self._hi > self._lo:  # steps come in order: one ending before the last kept is not true either
            ok &= ends >= self._ends[self._hi - 1]
        ok &= np.concatenate(([True], ends[1:] >= ends[:-1]))
        if not ok.all():
            self.dropped += int(np.count_nonzero(~ok))
            lanes, ends = lanes[ok], ends[ok]
        for column, counter in _ESTIMATES:  # (vLLM skips an all-zero step: adding 0 is the same)
            total = int(lanes[column].sum())
            if total:
                self.metrics.add(counter, total)
        self._append(lanes, ends)

    def _append(self, lanes: np.ndarray, ends: np.ndarray) -> None:
        n, cap = len(lanes), self.capacity
        self.total += n
        if n > cap:
            lanes, ends, n = lanes[-cap:], ends[-cap:], cap
        forward = np.where(lanes["forward_source"] != ForwardSource.NONE, lanes["forward_ns"], 0)
        if self._hi + n > 2 * cap:  # move the window's newest rows to the front
            keep = min(self._hi - self._lo, cap - n)
            for a in (self._lanes, self._ends):
                a[:keep] = a[self._hi - keep:self._hi]
            for a in (self._forward, self._prefill):
                a[:keep + 1] = a[self._hi - keep:self._hi + 1]
            self._lo, self._hi = 0, keep
        hi, rows = self._hi, slice(self._hi, self._hi + n)
        self._lanes[rows] = lanes
        self._ends[rows] = ends
        self._forward[hi + 1:hi + n + 1] = self._forward[hi] + np.cumsum(forward)
        self._prefill[hi + 1:hi + n + 1] = self._prefill[hi] + np.cumsum(lanes["prefill_tokens"])
        self._hi += n
        self._lo = max(self._lo, self._hi - cap)

    def columns(self, since_ns: int = 0) -> dict[str, np.ndarray]:
        """The kept steps that ended after `since_ns`, oldest first, one array per `COLUMNS` name
        (copies). Call `fold` first."""
        ends = self._ends[self._lo:self._hi]
        rows = slice(self._lo + int(np.searchsorted(ends, since_ns, "right")), self._hi)
        lanes = self._lanes[rows]
        out = {"end_ns": self._ends[rows].copy()}
        out.update((name, lanes[name].astype(np.float64 if name == "kv_usage" else np.int64))
                   for name in LANE_DTYPE.names)
        return out

    def summaries(self, sched: np.ndarray, first: np.ndarray, last: np.ndarray) -> dict[str, np.ndarray] | None:
        """Per request (engine ns of its first scheduling, first and last token; 0 = none), from the
        steps that ended from its scheduling to its last token: `steps`, `forward_ns` (of the measured
        ones), `max_batch` (the most requests in one of them) and `interfering_prefill_tokens` (prompt
        tokens computed in the steps after its first token: other requests' prefills, and its own
        recomputation after a preemption). `covered`: the window still held its first step (where
        False, or it never ran, the summary is zeros). None when no step was kept."""
        self.fold()
        lo, hi = self._lo, self._hi
        if hi == lo:
            return None
        ends = self._ends[lo:hi]
        covered = (sched > 0) & (last >= sched) & (sched >= self._lanes["start_ns"][lo])  # holds its first step
        i0 = np.where(covered, ends.searchsorted(sched, "left"), 0)
        i1 = np.where(covered, ends.searchsorted(last, "right"), 0)
        j0 = np.maximum(ends.searchsorted(first, "right"), i0)  # the steps after the one of its first token
        batch = self._lanes["num_requests"]
        max_batch = np.array([int(batch[lo + a:lo + b].max()) if b > a else 0
                              for a, b in zip(i0.tolist(), i1.tolist())], np.int64)
        return {"steps": i1 - i0, "forward_ns": self._forward[lo + i1] - self._forward[lo + i0],
                "max_batch": max_batch, "interfering_prefill_tokens": np.where(
                    i1 > j0, self._prefill[lo + i1] - self._prefill[lo + np.minimum(j0, i1)], 0),
                "covered": covered}
