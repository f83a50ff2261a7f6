"""MetricsState's snapshots: one copy of the whole state, immutable, exemplars only when asked for."""

import numpy as np

from otel_llm.canonical.instruments import Instrument, Kind
from otel_llm.canonical.metrics_state import MetricsState

TABLE = {
    "h": Instrument("h", Kind.HISTOGRAM, "s", "", (0.1, 1.0), exemplars=True),
    "n": Instrument("n", Kind.HISTOGRAM, "1", "", (1.0, 10.0)),
    "c": Instrument("c", Kind.COUNTER, "1", ""),
    "g": Instrument("g", Kind.GAUGE, "1", ""),
}


def record(m: MetricsState, seconds: float, span_id: int) -> None:
    m.histograms["h"].record(np.array([seconds * 1e9]), 0, np.array([[1, 2, span_id, 0]], np.uint64))
    m.histograms["n"].record(np.array([5.0]))
    m.add("c", 1)


def state(m: MetricsState, snap) -> tuple:
    h = snap.histograms["h"]
    return (h.counts.tolist(), h.sums.tolist(), h.mins.tolist(), h.maxs.tolist(),
            snap.histograms["n"].counts.tolist(), snap.counters["c"].tolist(),
            None if h.exemplars is None else h.exemplars[0][:, 2].tolist())


def test_a_snapshot_keeps_its_values_while_the_state_moves_on():
    m = MetricsState(TABLE)
    record(m, 0.05, 7)
    first = m.snapshot(1)
    before = state(m, first)
    assert before[0] == [[1, 0, 0]] and before[5] == [1.0] and 7 in before[6]
    held = first.counters["c"]  # a reader keeping one array of it keeps the whole copy from reuse
    del first
    for i in range(3):
        record(m, 2.0, 8 + i)
        later = m.snapshot(2 + i)
    assert held.tolist() == [1.0]
    assert state(m, later)[0] == [[1, 0, 3]] and state(m, later)[5] == [4.0]
    again = m.snapshot(9)  # `later` is still alive: its copy is not written over
    record(m, 0.5, 20)
    assert state(m, later)[5] == [4.0] and state(m, m.snapshot(10))[5] == [5.0]
    assert again.counters["c"].tolist() == [4.0]
    del later, again, held
    buffer = id(m.snapshot(11).counters["c"].base)  # nothing of it is left once this line is done ...
    record(m, 0.5, 21)
    reused = m.snapshot(12)
    assert id(reused.counters["c"].base) == buffer and state(m, reused)[5] == [6.0]  # ... so it is written over


def test_writes_go_to_the_arrays_a_snapshot_copies():
    """The state's arrays are views into the copied buffer: in-place writes of every kind show up."""
    m = MetricsState(TABLE)
    m.histograms["h"].record_repeated(0.5e9, 3)
    m.histograms["n"].record_weighted(np.array([5.0, 50.0]), np.array([2, 1]))
    m.add_many("c", np.array([0, 0]))
    m.gauges["g"] = 0.25
    snap = m.snapshot(1)
    assert snap.histograms["h"].counts.tolist() == [[0, 3, 0]]
    assert snap.histograms["n"].counts.tolist() == [[0, 2, 1]] and snap.histograms["n"].sums.tolist() == [60.0]
    assert snap.histograms["h"].mins.tolist() == [0.5] and snap.histograms["h"].maxs.tolist() == [0.5]
    assert snap.counters["c"].tolist() == [2.0] and snap.gauges["g"] == 0.25


def test_exemplars_are_copied_only_when_asked_for():
    m = MetricsState(TABLE)
    record(m, 0.05, 7)
    assert m.snapshot(1, exemplars=False).histograms["h"].exemplars is None
    record(m, 0.05, 9)  # the reused copy's exemplar part is stale: asking again copies it
    ex = m.snapshot(2).histograms["h"].exemplars
    assert ex[0][:, 2].tolist()[0] == 9 and ex[2].tolist()[0] == 2
    assert m.snapshot(3, exemplars=False).histograms["h"].counts.tolist() == [[2, 0, 0]]
