"""HistogramState: every recording path buckets as Prometheus does (bounds[i-1] < v <= bounds[i])."""

import numpy as np
import pytest

from otel_llm.canonical.aggregation import HistogramState

BOUNDS = (0.01, 0.1, 0.5, 1.0, 5.0)


def reference(values, bounds=BOUNDS):
    """Counts per bucket, the last one +Inf, by the definition (one comparison per value and bound)."""
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[next((i for i, b in enumerate(bounds) if v <= b), len(bounds))] += 1
    return counts


def values(n, seed=0):
    rng = np.random.default_rng(seed)
    v = rng.exponential(0.5, n)
    v[: len(BOUNDS)] = BOUNDS[:n]  # values exactly on a bound belong to that bound's bucket
    return v


@pytest.mark.parametrize("n", [1, 7, 5000, 20_000])  # 20,000 > the buffer: recorded in chunks
def test_one_series_sorted_path_equals_the_definition(n):
    v = values(n)
    h = HistogramState(BOUNDS)
    h.record(v)
    h.flush()
    assert h.counts[0].tolist() == reference(v)
    assert h.sums[0] == pytest.approx(v.sum()) and h.mins[0] == v.min() and h.maxs[0] == v.max()


def test_one_series_of_many_uses_that_series_and_mixed_series_split():
    v = values(3000, seed=1)
    h = HistogramState(BOUNDS, num_series=3)
    h.record(v, 2)  # all in series 2: the sorted path
    h.flush()
    assert h.counts[2].tolist() == reference(v) and h.counts[:2].sum() == 0
    series = np.arange(3000) % 3
    h2 = HistogramState(BOUNDS, num_series=3)
    h2.record(v, series)  # mixed: the per-value path
    h2.flush()
    for s in range(3):
        assert h2.counts[s].tolist() == reference(v[series == s])
        assert h2.sums[s] == pytest.approx(v[series == s].sum())


@pytest.mark.parametrize("series", [2, "one of three", "two of three", "all three"])
def test_a_batch_folded_now_equals_one_recorded_and_flushed(series):
    v = values(3000, seed=2)
    s = {"one of three": np.full(3000, 1), "two of three": np.arange(3000) % 2,
         "all three": np.arange(3000) % 3}.get(series, series)
    folded, buffered = HistogramState(BOUNDS, num_series=3, scale=2.0), HistogramState(BOUNDS, num_series=3, scale=2.0)
    folded.fold(v, s)
    buffered.record(v, s)
    buffered.flush()
    assert folded.counts.tolist() == buffered.counts.tolist() and folded.counts.sum() == 3000
    assert folded.sums == pytest.approx(buffered.sums)
    assert folded.mins.tolist() == buffered.mins.tolist() and folded.maxs.tolist() == buffered.maxs.tolist()


@pytest.mark.parametrize("fold", [False, True])
def test_out_of_range_series_are_dropped_and_counted(fold):
    h = HistogramState(BOUNDS, num_series=2)
    if fold:
        h.fold(np.array([0.2, 0.3, 0.4]), np.array([0, 5, 5]))
        h.fold(np.array([0.2]), 2)
        h.fold(np.array([]), np.array([], np.int64))
    else:
        h.record(np.array([0.2, 0.3, 0.4, 0.2]), np.array([0, 5, 5, 2]))
        h.flush()
    assert h.counts.sum() == 1 and h.dropped == 3


def test_repeated_values_equal_recording_them_one_by_one():
    h, one_by_one = HistogramState(BOUNDS), HistogramState(BOUNDS)
    for value, count in ((0.1, 64), (0.3, 5), (7.0, 2), (0.1, 1)):
        h.record_repeated(value, count, series=3)  # a single-series histogram ignores the series, as record() does
        one_by_one.record(np.full(count, value), 3)
    h.flush()
    one_by_one.flush()
    assert h.counts.tolist() == one_by_one.counts.tolist() == [reference([0.1] * 65 + [0.3] * 5 + [7.0] * 2)]
    assert h.sums[0] == pytest.approx(one_by_one.sums[0]) and (h.mins[0], h.maxs[0]) == (0.1, 7.0)
