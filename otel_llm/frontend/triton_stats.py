"""Triton-style cumulative statistics (the KServe v2 statistics extension).

`TritonStats` accumulates, per model and version, exactly the `$model_stat`
object of the Triton statistics extension: `inference_count`,
`execution_count`, `last_inference`, `inference_stats`, `batch_stats`,
`response_stats` and `memory_usage`, every duration as `{"count", "ns"}`.

How LLM serving maps onto Triton's fields (engine clock, ns):
- success / fail: finished requests (stop, length) / (abort, error), ns = e2e.
- queue: first SCHEDULED - QUEUED; compute_input: prefill; compute_infer: decode;
  compute_output: counted per successful request with ns 0 (detokenization is not
  timed); cache_hit / cache_miss: always 0 (there is no response cache).
- execution_count: engine steps that produced tokens; batch_stats: per step
  batch size, compute_infer ns = time since the previous step.
- response_stats: key = response (output chunk) index; compute_infer and success
  ns = time to produce that response (index 0: first token - SCHEDULED).
"""

from __future__ import annotations

import numpy as np

from otel_llm.engine.step import FinishReason
from otel_llm.export.redaction import echoed
from otel_llm.frontend.request_table import FinishedBatch, RequestTable

# Failures: ABORT (2) and ERROR (3); STOP, LENGTH and REPETITION (vLLM counts it a success) succeed.
# Ints compare ~5x faster than the enum.
_ABORT, _ERROR = int(FinishReason.ABORT), int(FinishReason.ERROR)
_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


class UnknownModel(LookupError):
    """Statistics asked for a model/version that is not served."""


def _d(count: int = 0, ns: int = 0) -> dict:
    return {"count": int(count), "ns": int(ns)}


class TritonStats:
    """Cumulative per-model statistics. Same locking as the owning Telemetry."""

    def __init__(self, name: str, version: str = "1"):
        self.name, self.version = name, version
        self.inference_count = 0
        self.last_inference_ms = 0
        self.durations = {k: [0, 0] for k in _DURATIONS}

    def on_arrival(self, wall_ms: int) -> None:
        self.last_inference_ms = wall_ms

    def on_finished(self, b: FinishedBatch) -> None:
        ok = (b.reason != _ABORT) & (b.reason != _ERROR)
        e2e = b.finish_recv - b.arrival
        d = self.durations
        for key, mask in (("success", ok), ("fail", ~ok)):
            d[key][0] += int(mask.sum())
            d[key][1] += int(e2e[mask].sum())
        v = b.engine_valid
        for key, ns in (("queue", b.sched - b.queued), ("compute_input", b.first - b.sched),
                        ("compute_infer", b.last - b.first)):
            d[key][0] += int(v.sum())
            d[key][1] += int(ns[v].sum())
        d["compute_output"][0] += int(ok.sum())
        self.inference_count += int(ok.sum())

    def model_stat(self, table: RequestTable) -> dict:
        """The `$model_stat` object; `table` supplies the per-response and per-batch data."""
        table.checkpoint()
        counts, ns = table.resp_count[:-1], table.resp_ns  # the last entry counts indices past the cap
        responses = {}
        for i in np.nonzero(counts)[0].tolist():
            r = _d(counts[i], ns[i])
            responses[str(i)] = {"compute_infer": r, "compute_output": _d(), "success": dict(r),
                                 "fail": _d(), "empty_response": _d(), "cancel": _d()}
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": sum(c for c, _ in table.batch_sizes.values()),
            "inference_stats": {k: _d(*v) for k, v in self.durations.items()},
            "response_stats": responses,
            "batch_stats": [
                {"batch_size": size, "compute_input": _d(), "compute_infer": _d(c, t), "compute_output": _d()}
                for size, (c, t) in sorted(table.batch_sizes.items())
            ],
            "memory_usage": [],
        }


def statistics_response(telemetries, name: str | None = None, version: str | None = None) -> dict:
    """`$stats_model_response` over several Telemetry objects; raises UnknownModel."""
    stats = [t.model_statistics() for t in telemetries if t.enabled]
    if name is not None:
        stats = [s for s in stats if s["name"] == name]
        if not stats:
            raise UnknownModel(f"requested model '{echoed(name)}' is not available")
        if version is not None:
            stats = [s for s in stats if s["version"] == version]
            if not stats:
                raise UnknownModel(f"requested model '{echoed(name)}' version '{echoed(version)}' is not available")
    return {"model_stats": stats}
