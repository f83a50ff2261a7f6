"""`RenderPlan`: every value a render shows, read in a few numpy calls, equals the same value read
series by series (cumulative counts at the shown bounds, sums and counter values, summed over the
series a family keeps together)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from otel_llm.export.render_plan import RenderPlan


def per_series(counts, sums, series, ends):
    rows = counts[series] if isinstance(series, int) else counts[series].sum(axis=0)
    total = sums[series] if isinstance(series, int) else sums[series].sum()
    return np.cumsum(rows)[ends].tolist(), float(total)


def test_every_value_equals_its_series_by_series_reading():
    rng = np.random.default_rng(7)
    shapes = {"a": (8, 35), "b": (1, 12), "c": (3, 5)}
    histograms = {name: SimpleNamespace(counts=rng.integers(0, 1 << 40, shape), sums=rng.random(shape[0]) * 1e3)
                  for name, shape in shapes.items()}
    counters = {"x": rng.random(6) * 1e6, "y": np.array([3.0])}
    groups = {"a": [slice(None), 2, np.array([0, 5, 7]), np.array([1])], "b": [0], "c": [slice(None), 1, 2]}
    entries, expected, expected_sums = [], [], []
    for name in ("c", "a", "b", "a"):  # an instrument shown by two families: read twice
        n, nb = shapes[name]
        for series in groups[name]:
            ends = np.sort(rng.choice(nb - 1, size=min(nb - 1, 6), replace=False))
            ends = np.append(ends, nb - 1)  # +Inf's: the last fine bucket
            entries.append((name, n, nb, series, ends))
            values, total = per_series(histograms[name].counts, histograms[name].sums, series, ends)
            expected += values
            expected_sums.append(total)
    counter_entries = [("x", 6, slice(None)), ("y", 1, 0), ("x", 6, 4), ("x", 6, np.array([0, 2]))]
    expected_counters = [float(counters["x"].sum()), 3.0, float(counters["x"][4]), float(counters["x"][[0, 2]].sum())]

    cumulative, sums, values = RenderPlan(entries, counter_entries).numbers(histograms, counters)
    assert cumulative == expected and all(type(v) is int for v in cumulative)
    assert np.allclose(sums, expected_sums, rtol=1e-15, atol=0)
    assert [s for s, (_, _, _, series, _) in zip(sums, entries) if isinstance(series, int)] == \
        [t for t, (_, _, _, series, _) in zip(expected_sums, entries) if isinstance(series, int)]  # one series: exact
    assert np.allclose(values, expected_counters, rtol=1e-15, atol=0) and values[1:3] == expected_counters[1:3]


def test_a_source_with_nothing_shown_reads_nothing():
    assert RenderPlan([], []).numbers({}, {}) == ([], [], [])
    assert RenderPlan([], [("x", 2, 1)]).numbers({}, {"x": np.array([1.0, 2.5])}) == ([], [], [2.5])
