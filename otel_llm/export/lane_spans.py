"""The engine lane as spans: one `engine steps` span per window of steps (at most 1 s or 256 steps).

Why spans, and one per window: a trace backend (Jaeger, Tempo) stores and shows spans, a tail
sampler decides on them with the request traces, and the collector's trace store and timeline read
them like any trace; but a span per step would cost the API process several microseconds per step
and a trace backend hundreds of bytes per step. A window span carries its steps columnar, one array
attribute per figure (step i is element i of each), about 35 bytes per step over OTLP: ~3.5 KB/s per
engine at 100 steps/s. Jaeger's own UI shows the window as a span and its arrays as tags; the
collector's `/ui` and `otel-llm timeline` draw each step.

Attributes (arrays of one value per step, oldest first): `otel_llm.lane.start_offset_us` (from the
span's start), `.duration_us`, `.forward_us` (-1: not measured), `.prefill_tokens`, `.decode_tokens`,
`.batch_requests`, `.running`, `.waiting`, `.preemptions`, `.kv_usage` (0..1), `.blocked`
(`otel_llm.engine.step.Blocked` codes); scalars `otel_llm.lane.steps`, `otel_llm.lane.forward_source`
(`host`, `cuda` or `none`), `gen_ai.request.model` and `otel_llm.engine`.
"""

from __future__ import annotations

import numpy as np

from otel_llm.engine.step import ForwardSource

LANE_SPAN = "engine steps"
_NO_FORWARD = int(ForwardSource.NONE)  # (a plain int: numpy converts an enum member slowly)
LANE_PREFIX = "otel_llm.lane."
# (attribute suffix, lane column): integer arrays copied as they are
_COUNTS = (("prefill_tokens", "prefill_tokens"), ("decode_tokens", "decode_tokens"),
           ("batch_requests", "num_requests"), ("running", "running"), ("waiting", "waiting"),
           ("preemptions", "preemptions"), ("blocked", "blocked"))
STEP_COLUMNS = ("start_ns", "end_ns", "forward_ns", "kv_usage", *(column for _, column in _COUNTS))  # `lane_steps`'


def lane_attributes(cols: dict[str, np.ndarray], start_ns: int) -> dict:
    """The window's attributes from `EngineLane.columns` (engine ns; `start_ns`: the span's start)."""
    sources = cols["forward_source"]
    measured = sources != _NO_FORWARD
    attrs = {
        LANE_PREFIX + "steps": len(sources),
        LANE_PREFIX + "forward_source": ForwardSource(int(sources.max())).name.lower() if len(sources) else "none",
        LANE_PREFIX + "start_offset_us": ((cols["start_ns"] - start_ns) // 1000).tolist(),
        LANE_PREFIX + "duration_us": ((cols["end_ns"] - cols["start_ns"]) // 1000).tolist(),
        LANE_PREFIX + "forward_us": np.where(measured, cols["forward_ns"] // 1000, -1).tolist(),
        LANE_PREFIX + "kv_usage": np.round(cols["kv_usage"], 4).tolist(),
    }
    attrs.update((LANE_PREFIX + name, cols[column].tolist()) for name, column in _COUNTS)
    return attrs


def lane_steps(attributes: dict, start_ns: int) -> dict[str, np.ndarray] | None:
    """Back from a span's attributes (`lane_attributes`) to columns: `start_ns`, `end_ns` (epoch ns,
    from the span's `start_ns`), `forward_ns` (-1: not measured) and the counts; None when they
    are missing or of unequal lengths (not a lane span, or a mangled one)."""
    try:
        offsets = np.asarray(attributes[LANE_PREFIX + "start_offset_us"], np.int64)
        n = len(offsets)
        cols = {"start_ns": start_ns + offsets * 1000}
        cols["end_ns"] = cols["start_ns"] + np.asarray(attributes[LANE_PREFIX + "duration_us"], np.int64) * 1000
        forward = np.asarray(attributes[LANE_PREFIX + "forward_us"], np.int64)
        cols["forward_ns"] = np.where(forward >= 0, forward * 1000, -1)
        cols["kv_usage"] = np.asarray(attributes[LANE_PREFIX + "kv_usage"], np.float64)
        for name, column in _COUNTS:
            cols[column] = np.asarray(attributes[LANE_PREFIX + name], np.int64)
    except (KeyError, TypeError, ValueError):
        return None
    return cols if all(len(v) == n for v in cols.values()) else None
