"""vLLM's engine steps as the engine lane (`otel_llm.export.lane_spans`), from what vLLM hands the stat logger.

What vLLM gives an API server's stat logger per step, and what each lane column is made of:

- `IterationStats.iteration_timestamp`: when the step's outputs reached this process. A step ends
  there; it starts where the previous one ended, or at the latest arrival of a request whose first
  token it produced (`time_to_first_tokens_iter`), whichever is later (a step after an idle engine
  starts no earlier than the request that woke it).
- tokens and batch: with `--enable-logging-iteration-details`, the `SchedulerStats`'
  `iteration_details` (prompt tokens and requests scheduled in the step, decode tokens and
  requests); without it, the prompt tokens computed by the prefills that finished in the step (vLLM
  reports a chunked prefill's tokens with its last chunk), the tokens decoded after a first token,
  and the requests that produced a token.
- `running`, `waiting`, `kv_usage` from the `SchedulerStats` (the last seen where vLLM sent this
  process none for a step), `preemptions` from the `IterationStats`; `blocked` is `other` while
  requests wait (vLLM does not say why), else `none`.
- forward time: vLLM hands none per step. With `--enable-logging-iteration-details` the step's
  host time vLLM measures around its model execution (`elapsed_ms`) is the lane's forward time
  (`forward_source` `host`); without it, `none`.

The windows (at most 1 s or 256 steps) are spans of vLLM's own tracer provider, which vLLM sets
when it traces (`--otlp-traces-endpoint`): they share the resource of vLLM's `llm_request` spans,
which is what a tail sampler keeps them by and what the collector's timeline lines them up with.
Without vLLM's tracing nothing is built. `OTEL_LLM_VLLM_LANE=off` turns the lane off.
"""

from __future__ import annotations

import numpy as np

from otel_llm.engine.step import Blocked, ForwardSource
from otel_llm.export.lane_spans import LANE_SPAN, lane_attributes

WINDOW_NS = 1_000_000_000  # a window spans at most this long
WINDOW_STEPS = 256  # and holds at most this many steps
_COLUMNS = ("start_ns", "end_ns", "forward_ns", "forward_source", "prefill_tokens", "decode_tokens", "num_requests",
            "running", "waiting", "preemptions", "kv_usage", "blocked")


class _Engine:
    """One engine's steps not exported yet, and what carries over from step to step."""

    def __init__(self):
        self.rows: list[tuple] = []
        self.last_end = 0
        self.scheduler = (0, 0, 0.0)  # running, waiting, KV usage as last seen


class VllmLane:
    """Folds vLLM's per-step stats into lane rows and exports them as window spans (under the aggregator's lock)."""

    def __init__(self, model_name: str, tracer):
        self.model_name = model_name
        self.tracer = tracer  # an OTel SDK tracer: vLLM's provider
        self.engines: dict[int, _Engine] = {}
        self.steps = 0  # steps exported

    def add(self, engine_idx: int, steps: list) -> None:
        """Steps as the aggregator queued them: (engine, SchedulerStats, IterationStats, mm stats)."""
        e = self.engines.get(engine_idx)
        if e is None:
            e = self.engines[engine_idx] = _Engine()
        for _, sched, it, _ in steps:
            if sched is not None:
                waiting = sched.num_waiting_reqs + getattr(sched, "num_skipped_waiting_reqs", 0)  # 0.20 on
                e.scheduler = (sched.num_running_reqs, waiting, sched.kv_cache_usage)
            if it is None:
                continue
            end = int(it.iteration_timestamp * 1e9)
            ttft, itl = it.time_to_first_tokens_iter, it.inter_token_latencies_iter
            start = min(max(e.last_end, end - int(min(ttft) * 1e9)) if ttft else e.last_end or end, end)
            details = getattr(sched, "iteration_details", None) if sched is not None else None
            if details is not None and not getattr(details, "is_dummy", False):
                prefill, decode = details.num_ctx_tokens, details.num_generation_tokens
                batch = details.num_ctx_requests + details.num_generation_requests
                forward, source = int(details.elapsed_ms * 1e6), ForwardSource.HOST
            else:
                pts = getattr(it, "prompt_token_stats", None)
                prefill = it.num_prompt_tokens if pts is None else pts.computed
                decode, batch = it.num_generation_tokens - len(ttft), len(ttft) + len(itl)
                forward, source = 0, ForwardSource.NONE
            running, waiting, kv = e.scheduler
            e.rows.append((start, end, forward, source, prefill, decode, batch, running, waiting,
                           it.num_preempted_reqs, kv, Blocked.OTHER if waiting else Blocked.NONE))
            e.last_end = end

    def export(self) -> None:
        """Every pending step, in windows of at most WINDOW_NS and WINDOW_STEPS."""
        for idx, e in self.engines.items():
            rows, e.rows = e.rows, []
            i = 0
            while i < len(rows):
                j, first = i + 1, rows[i][0]
                while j < len(rows) and j - i < WINDOW_STEPS and rows[j][1] - first <= WINDOW_NS:
                    j += 1
                self._emit(rows[i:j], str(idx))
                i = j

    def _emit(self, rows: list[tuple], engine: str) -> None:
        cols = {name: np.array(values, np.float64 if name == "kv_usage" else np.int64)
                for name, values in zip(_COLUMNS, zip(*rows))}
        start = int(cols["start_ns"].min())
        attrs = {"gen_ai.request.model": self.model_name, "otel_llm.engine": engine, **lane_attributes(cols, start)}
        from opentelemetry.context import Context

        span = self.tracer.start_span(LANE_SPAN, context=Context(), attributes=attrs, start_time=start)
        span.end(int(cols["end_ns"][-1]))
        self.steps += len(rows)


def vllm_tracer():
    """vLLM's tracer provider's tracer for the lane, or None when vLLM does not trace (no SDK provider set)."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if not hasattr(provider, "add_span_processor"):  # the API's proxy or no-op provider: vLLM is not tracing
        return None
    return provider.get_tracer("otel_llm.vllm")
