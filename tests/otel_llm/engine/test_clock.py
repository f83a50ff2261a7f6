"""One clock for every span: monotonic timestamps through one per-process anchor, and another
process's converted with ours when it is on this host's monotonic clock."""

import subprocess
import sys
import time

from otel_llm.engine import clock


def test_a_process_of_this_host_converts_with_our_anchor():
    out = subprocess.run([sys.executable, "-c", "from otel_llm.engine import clock; "
                          "print(clock.ANCHOR_WALL_NS, clock.ANCHOR_MONO_NS)"], capture_output=True, text=True,
                         check=True).stdout.split()
    wall, mono = int(out[0]), int(out[1])
    assert mono > clock.ANCHOR_MONO_NS  # a later process: its own anchor, on the same monotonic clock
    assert clock.offset_for(wall, mono) == clock.OFFSET_NS
    # the other process's timestamps then order with ours: its `now` lies between two of ours
    before = time.monotonic_ns()
    theirs = int(subprocess.run([sys.executable, "-c", "import time; print(time.monotonic_ns())"],
                                capture_output=True, text=True, check=True).stdout)
    after = time.monotonic_ns()
    assert clock.epoch_ns(before) < clock.epoch_ns(theirs) < clock.epoch_ns(after)


def test_another_hosts_clock_keeps_its_own_anchor():
    boot_apart = 3 * 86400 * 10**9  # another host booted three days earlier
    wall, mono = time.time_ns(), time.monotonic_ns() + boot_apart
    assert clock.offset_for(wall, mono) == wall - mono != clock.OFFSET_NS
    assert clock.offset_for(wall, mono - boot_apart + 400_000_000) == clock.OFFSET_NS  # 0.4 s apart: ours


def test_now_is_on_the_one_clock():
    a = clock.now_epoch_ns()
    b = clock.epoch_ns(time.monotonic_ns())
    assert a <= b < a + 10**9 and abs(b - time.time_ns()) < 10**9
