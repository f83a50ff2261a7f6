"""One clock for every timestamp otel_llm records, so spans made apart agree with each other.

Times are taken on the monotonic clock (``time.monotonic_ns``: CLOCK_MONOTONIC, the same in every
process of a host) and turned into epoch nanoseconds by one (wall, monotonic) anchor per process,
taken when this module is first imported. The wall clock itself is slewed and stepped by NTP while
a server runs: a span timed with ``time.time_ns()`` now and one timed on the monotonic clock through
an anchor taken hours ago disagree by what the wall clock moved in between (a child span drawn
before its parent). On one clock, through one anchor, the order of what happened is kept exactly;
a whole trace is off the wall clock by at most that drift, all of it together.

Another process's monotonic timestamps (the engine's, carried with its own anchor in each step
record) are converted with this process's anchor when the two anchors say it is the same clock
(their offsets agree within `SAME_CLOCK_NS`: a process of this host; hosts' monotonic clocks
differ by their boot times), with its own anchor otherwise (`offset_for`).
"""

from __future__ import annotations

import time

ANCHOR_WALL_NS, ANCHOR_MONO_NS = time.time_ns(), time.monotonic_ns()
OFFSET_NS = ANCHOR_WALL_NS - ANCHOR_MONO_NS  # monotonic -> epoch ns in this process
SAME_CLOCK_NS = 1_000_000_000


def epoch_ns(mono_ns: int) -> int:
    """A monotonic timestamp of this host as epoch ns, through this process's anchor."""
    return mono_ns + OFFSET_NS


def now_epoch_ns() -> int:
    """Now on the one clock (use it where ``time.time_ns()`` would time a span)."""
    return time.monotonic_ns() + OFFSET_NS


def offset_for(anchor_wall_ns: int, anchor_mono_ns: int, own_offset_ns: int = OFFSET_NS) -> int:
    """The monotonic -> epoch offset for timestamps taken with (anchor_wall_ns, anchor_mono_ns): ours
    when that anchor is on this host's monotonic clock, else its own."""
    theirs = anchor_wall_ns - anchor_mono_ns
    return own_offset_ns if abs(theirs - own_offset_ns) < SAME_CLOCK_NS else theirs
