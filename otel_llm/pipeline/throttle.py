"""SnapshotThrottle: at most one scheduler snapshot per interval (1 s) for one (stage, replica).

vLLM-Omni throttles `make_stats()` per scheduler, i.e. per (stage, replica): each replica owns
its own throttle. (An earlier global throttle on its orchestrator let only the first replica
to report in each second through, starving every other replica.) Use one per engine loop:

    snap = throttle.offer(SchedulerSnapshot(running, waiting, kv_usage, preemptions=n, ...))
    if snap is not None:
        recorder.snapshot(snap)

`SchedulerSnapshot` counters (prefix-cache queries/hits, preemptions, their external
counterparts) are deltas since the last snapshot, so the throttle sums the ones it holds back
into the next one it lets through; the other fields (running, waiting, KV usage, ...) are the
latest. Totals therefore stay exact under throttling; only gauge freshness is traded.

Threads: owned by one engine loop; not thread-safe. `clock` (monotonic ns) is injectable.
"""

from __future__ import annotations

import time
from dataclasses import replace

from otel_llm.engine.step import SchedulerSnapshot

_DELTAS = ("prefix_queries", "prefix_hits", "preemptions", "external_prefix_queries", "external_prefix_hits")


class SnapshotThrottle:
    def __init__(self, interval_s: float = 1.0, clock=time.monotonic_ns):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_ns = int(interval_s * 1e9)
        self._clock = clock
        self._last: int | None = None  # when the last snapshot went through
        self._held: dict[str, int] = dict.fromkeys(_DELTAS, 0)  # deltas of the snapshots held back

    def due(self) -> bool:
        """True (and restarts the interval) when a snapshot may go now: the first call, then
        once `interval_s` has passed since the last that went."""
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_ns:
            return False
        self._last = now
        return True

    def offer(self, snapshot: SchedulerSnapshot) -> SchedulerSnapshot | None:
        """The snapshot to attach to this step (with the held-back deltas added), or None."""
        if not self.due():
            for name in _DELTAS:
                self._held[name] += getattr(snapshot, name)
            return None
        if not any(self._held.values()):
            return snapshot
        merged = replace(snapshot, **{name: getattr(snapshot, name) + self._held[name] for name in _DELTAS})
        self._held = dict.fromkeys(_DELTAS, 0)
        return merged
