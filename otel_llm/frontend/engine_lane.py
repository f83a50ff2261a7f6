"""The engine lane on the frontend: one engine's latest steps, as its records carried them.

Each step record with a lane (`otel_llm.engine.step.StepLane`: the step's start, forward time,
prefill and decode tokens, batch, scheduler state and why the queue waited) leaves it here. On the
step path that is one list append of the record's bytes, not decoded; `fold` (every `FOLD_AT` steps
and before every read, under the owner's lock) decodes the kept lanes at once with numpy, drops the
ones that cannot be true (counted), sums vLLM's MFU estimates into their counters and writes the rest
into a ring of the last `capacity` steps (at 100 steps/s the default holds about 80 s), which readers
copy out columnar (`columns`).
"""

from __future__ import annotations

import numpy as np

from otel_llm.canonical.metrics_state import MetricsState
from otel_llm.engine.step import HEADER_SIZE, LANE_DTYPE, LANE_SIZE

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
        self._ring = np.zeros(capacity, LANE_DTYPE)
        self._ends = np.zeros(capacity, np.int64)
        self.total = 0  # steps kept, including those the ring let go since
        self.dropped = 0  # lanes that could not be true
        self._pending: list[tuple[int, bytes, int]] = []  # (end ns, bytes, offset of the lane)

    def add(self, end_ns: int, data: bytes, offset: int = HEADER_SIZE) -> None:
        """A step that ended at `end_ns` whose lane is packed in `data` at `offset` (a step record's bytes)."""
        self._pending.append((end_ns, data, offset))
        if len(self._pending) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Decode the kept lanes: check them, sum the estimates, write them into the ring."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        lanes = np.frombuffer(b"".join(d[o:o + LANE_SIZE] for _, d, o in pending), LANE_DTYPE)
        ends = np.fromiter((e for e, _, _ in pending), np.int64, len(pending))
        ok = (lanes["start_ns"] <= ends) & (lanes["kv_usage"] >= 0.0) & (lanes["kv_usage"] <= 1.0)
        for name in _COUNTS:
            ok &= lanes[name] >= 0
        if not ok.all():
            self.dropped += int(np.count_nonzero(~ok))
            lanes, ends = lanes[ok], ends[ok]
        for column, counter in _ESTIMATES:  # (vLLM skips an all-zero step: adding 0 is the same)
            total = int(lanes[column].sum())
            if total:
                self.metrics.add(counter, total)
        n = len(lanes)
        if n > self.capacity:
            lanes, ends = lanes[-self.capacity:], ends[-self.capacity:]
        at = (self.total + np.arange(len(lanes))) % self.capacity
        self._ring[at] = lanes
        self._ends[at] = ends
        self.total += n

    def columns(self, since_ns: int = 0) -> dict[str, np.ndarray]:
        """The kept steps that ended after `since_ns`, oldest first, one array per `COLUMNS` name
        (copies). Call `fold` first."""
        kept = min(self.total, self.capacity)
        order = (self.total - kept + np.arange(kept)) % self.capacity
        ends = self._ends[order]
        take = order[ends > since_ns]
        out = {"end_ns": self._ends[take]}
        lanes = self._ring[take]
        out.update((name, lanes[name].astype(np.float64 if name == "kv_usage" else np.int64))
                   for name in LANE_DTYPE.names)
        return out
