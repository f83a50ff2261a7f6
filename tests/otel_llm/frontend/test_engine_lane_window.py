"""EngineLane's window: the last `capacity` steps in order, whatever the batches they arrive in;
per-request summaries from running totals equal to summing the steps by hand, across the buffer's
moves; a request whose first step left the window gets no summary; lanes that cannot be true
(negative, out of order, a start after the end) are dropped and counted."""

from __future__ import annotations

import numpy as np
import pytest

from otel_llm.shim.profiles import aggregation_table
from otel_llm.canonical.metrics_state import MetricsState
from otel_llm.engine.step import ForwardSource, StepLane
from otel_llm.frontend.engine_lane import EngineLane


def _lane(i: int) -> tuple[int, bytes]:
    """Step i: starts at 100 i, ends 100 i + 60; forward 10 i ns (unmeasured every 5th step),
    prefill i % 7 tokens, batch 1 + i % 4."""
    source = ForwardSource.NONE if i % 5 == 0 else ForwardSource.HOST
    lane = StepLane(100 * i, 10 * i if source else 0, i % 7, 2, 1 + i % 4, 3, 0, 0, 0.5, 0, 0, 0, 0, source)
    return 100 * i + 60, lane.pack()


def _by_hand(steps: range) -> dict:
    return {"steps": len(steps), "forward_ns": sum(10 * i for i in steps if i % 5),
            "max_batch": max(1 + i % 4 for i in steps)}


@pytest.mark.parametrize("batch,capacity", [(1, 8), (3, 8), (8, 8), (11, 8), (12, 16), (16, 16)])
def test_the_window_keeps_the_last_steps_and_sums_a_requests_steps(batch, capacity):
    """Batches of a lane or a few (folded one by one), more than the window (its newest kept) and
    between (numpy: copied as they came)."""
    lane = EngineLane(MetricsState(aggregation_table(8192)), capacity=capacity)
    for start in range(0, 40, batch):
        for i in range(start, min(start + batch, 40)):
            end, data = _lane(i)
            lane.add(end, data, 0)
        lane.fold()
    cols = lane.columns()
    assert cols["end_ns"].tolist() == [100 * i + 60 for i in range(40 - capacity, 40)]
    assert cols["prefill_tokens"].tolist() == [i % 7 for i in range(40 - capacity, 40)]
    assert cols["num_requests"].tolist() == [1 + i % 4 for i in range(40 - capacity, 40)]
    assert lane.columns(since_ns=100 * 37 + 60)["end_ns"].tolist() == [3860, 3960]
    # requests: scheduled during step 33 (first token in 34), last token in 38; one scheduled in step 10
    sched, first, last = (np.array(v, np.int64) for v in ([3310, 1010], [3460, 1160], [3860, 3860]))
    s = lane.summaries(sched, first, last)
    assert s["covered"].tolist() == [True, False]
    want = _by_hand(range(33, 39))
    assert (int(s["steps"][0]), int(s["forward_ns"][0]), int(s["max_batch"][0])) == (
        want["steps"], want["forward_ns"], want["max_batch"])
    assert int(s["interfering_prefill_tokens"][0]) == sum(i % 7 for i in range(35, 39))  # after its first token
    assert (s["steps"][1], s["forward_ns"][1], s["interfering_prefill_tokens"][1]) == (0, 0, 0)
    for k in (0, 1):  # one request at a time (a tracer's), in plain Python: the same figures
        one = lane.summaries(sched[k:k + 1], first[k:k + 1], last[k:k + 1])
        assert {key: int(v[0]) for key, v in one.items()} == {key: int(v[k]) for key, v in s.items()}
    assert lane.total == 40 and lane.dropped == 0


def test_lanes_that_cannot_be_true_are_dropped_and_counted():
    lane = EngineLane(MetricsState(aggregation_table(8192)), capacity=8)
    end, data = _lane(5)
    lane.add(end, data, 0)
    good = StepLane(1000, 5, 1, 1, 1, 1, 0, 0, 0.5)
    for bad, at in ((good._replace(prefill_tokens=-1), 1100), (good._replace(kv_usage=1.5), 1100),
                    (good._replace(start_ns=1200), 1100), (good, 400)):  # the last: ends before step 5 did
        lane.add(at, bad.pack(), 0)
    lane.fold()
    assert lane.dropped == 4 and lane.columns()["end_ns"].tolist() == [560]
    assert list(lane.summaries(np.array([0]), np.array([0]), np.array([0]))["covered"]) == [False]


@pytest.mark.parametrize("steps,fold_every", [(30, 0), (32, 1)])  # the second fills the buffer to its end
@pytest.mark.parametrize("seed", range(5))
def test_summaries_of_many_requests_equal_each_alone(seed, steps, fold_every):
    """The vectorised summaries (many requests: segment maxima in one reduceat) equal the plain-Python
    one request at a time, for requests ending at the newest step, spanning no step, or not covered."""
    rng = np.random.default_rng(seed)
    lane = EngineLane(MetricsState(aggregation_table(8192)), capacity=16)
    for i in range(steps):
        end, data = _lane(i)
        lane.add(end, data, 0)
        if fold_every and i % fold_every == 0:
            lane.fold()
    lane.fold()
    newest = 100 * (steps - 1) + 60
    n = 40
    sched = rng.integers(1000, 3100, n)
    first = sched + rng.integers(0, 400, n)
    last = np.minimum(first + rng.integers(0, 900, n), newest + rng.integers(0, 2, n) * 100)
    sched[::7] = 0  # never scheduled
    many = lane.summaries(sched, first, last)
    for k in range(n):
        one = lane.summaries(sched[k:k + 1], first[k:k + 1], last[k:k + 1])
        assert {key: int(v[0]) for key, v in one.items()} == {key: int(v[k]) for key, v in many.items()}, k


def test_a_batch_of_lanes_is_checked_and_summed_as_one_at_a_time_is():
    """`fold`'s vectorised checks (every count's sign at once, kv usage, start, order) and estimate
    sums keep, drop and add exactly what folding the same lanes one by one does."""
    good = StepLane(0, 5, 1, 1, 1, 1, 0, 0, 0.5, 10**12, 10**9, 7)
    lanes, at = [], 1000
    for i, field in enumerate(("forward_ns", "prefill_tokens", "decode_tokens", "num_requests", "running", "waiting",
                               "preemptions", "flops", "read_bytes", "write_bytes", None)):
        at += 100
        lanes.append((at, good._replace(start_ns=at - 50, flops=10**12 + i)))
        if field:
            lanes.append((at + 10, good._replace(start_ns=at - 40, **{field: -1})))
    at += 100
    lanes += [(at, good._replace(start_ns=at - 50, kv_usage=float("nan"))), (at, good._replace(start_ns=at + 1)),
              (at - 500, good._replace(start_ns=at - 600)), (at + 50, good._replace(start_ns=at, kv_usage=-0.1)),
              (at + 60, good._replace(start_ns=at + 10, write_bytes=2**40))]
    one, many = (EngineLane(MetricsState(aggregation_table(8192)), capacity=64) for _ in range(2))
    for end, lane in lanes:
        one.add(end, lane.pack(), 0)
        one.fold()
        many.add(end, lane.pack(), 0)
    many.fold()
    assert many.dropped == one.dropped == 14
    assert {k: v.tolist() for k, v in many.columns().items()} == {k: v.tolist() for k, v in one.columns().items()}
    assert many._estimates == one._estimates == [11 * 10**12 + 55 + 10**12, 12 * 10**9, 11 * 7 + 2**40]
