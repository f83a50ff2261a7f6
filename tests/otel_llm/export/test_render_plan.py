"""`RenderPlan`: every value a render shows, read in a few numpy calls, equals the same value read
series by series (cumulative counts at the shown bounds, sums and counter values, summed over the
series a family keeps together)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from otel_llm import FinishReason, RequestInfo, StepRecorder, Telemetry, TelemetryConfig
from otel_llm.canonical.instruments import Kind
from otel_llm.canonical.metrics_state import MetricsSnapshot
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

    snapshot = MetricsSnapshot(histograms, counters, {})
    cumulative, sums, values = RenderPlan(entries, counter_entries).numbers(snapshot)
    assert cumulative == expected and all(type(v) is int for v in cumulative)
    assert np.allclose(sums, expected_sums, rtol=1e-15, atol=0)
    assert [s for s, (_, _, _, series, _) in zip(sums, entries) if isinstance(series, int)] == \
        [t for t, (_, _, _, series, _) in zip(expected_sums, entries) if isinstance(series, int)]  # one series: exact
    assert np.allclose(values, expected_counters, rtol=1e-15, atol=0) and values[1:3] == expected_counters[1:3]


def test_a_state_snapshot_is_read_from_its_copy_as_array_by_array():
    """A Telemetry's snapshot carries its copy of the state (`words`): the plan reads the values from
    it, and they equal the ones read from its arrays (the path of a folded source, which has none)."""
    tel = Telemetry(TelemetryConfig(model_name="m", log_stats=False, tracing=False))
    rec = StepRecorder()
    handles = [tel.arrival(RequestInfo(f"r{i}", 100 + 37 * i, "chat" if i % 3 else "text_completion", max_tokens=64))
               for i in range(40)]
    for h in handles:
        rec.queued(h)
        rec.scheduled(h, 16)
    for step in range(12):
        rec.outputs(handles, 1)
        tel.ingest(rec.end_step_bytes(50))
    for i, h in enumerate(handles):
        rec.finished(h, FinishReason.LENGTH if i % 4 else FinishReason.STOP)
    tel.ingest(rec.end_step_bytes())
    snapshot = tel.snapshot(exemplars=False)
    assert snapshot.words is not None
    table = tel.table_spec
    histograms = [(name, inst.num_series, len(inst.buckets) + 1, series, np.array([0, 3, len(inst.buckets)]))
                  for name, inst in table.items() if inst.kind is Kind.HISTOGRAM
                  for series in (slice(None), inst.num_series - 1)]
    counters = [(name, inst.num_series, series) for name, inst in table.items() if inst.kind is Kind.COUNTER
                for series in (slice(None), 0)]
    plan = RenderPlan(histograms, counters)
    from_words = plan.numbers(snapshot)
    assert len(snapshot.histograms._made) == 0  # it cut no array out of the copy
    assert from_words == plan.numbers(snapshot._replace(words=None))
    assert sum(from_words[0]) > 0 and sum(from_words[2]) > 0  # and read something


def test_a_source_with_nothing_shown_reads_nothing():
    assert RenderPlan([], []).numbers(MetricsSnapshot({}, {}, {})) == ([], [], [])
    assert RenderPlan([], [("x", 2, 1)]).numbers(MetricsSnapshot({}, {"x": np.array([1.0, 2.5])}, {})) == \
        ([], [], [2.5])
