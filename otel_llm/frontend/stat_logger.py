"""The periodic INFO stat line, in vLLM's `LoggingStatLogger` format.

    Engine 000: Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: 240.1 tokens/s,
    Running: 8 reqs, Waiting: 2 reqs, Deferred: 1 reqs, GPU KV cache usage: 31.2%,
    Prefix cache hit rate: 45.0%, External prefix cache hit rate: 12.5%
    SpecDecoding metrics: Mean acceptance length: 2.10, Accepted throughput: 30.00 tokens/s, ...

Prompt throughput counts computed prompt tokens only (cached ones excluded), as
vLLM does. `Deferred` appears while some waiting requests are deferred, the
external (KV-connector) hit rate once the connector was queried in the window,
and the `SpecDecoding metrics` line (vLLM's `SpecDecodingLogging`, after the
main line, at its level) for an interval with drafts; its per-position rates
cover `num_speculative_tokens` positions (unset: up to the last position ever
accepted). The hit rates are over a recent window: the last `window` log
intervals (vLLM uses its last 1000 requests). When the current and the previous
interval both had zero throughput the lines drop to DEBUG, so an idle server is
silent. A daemon thread logs every `interval_s`; `log()` can also be called directly.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import numpy as np

logger = logging.getLogger("otel_llm.stats")


class _HitRate:
    """A hit rate (%) over the last `window` intervals, from cumulative queries and hits."""

    def __init__(self, window: int):
        self._intervals = collections.deque(maxlen=window)  # (queries, hits) per interval
        self._total = (0.0, 0.0)

    def update(self, queries: float, hits: float) -> float | None:
        """Close an interval at these totals; None when nothing was queried in the window."""
        self._intervals.append((queries - self._total[0], hits - self._total[1]))
        self._total = (queries, hits)
        q = sum(x for x, _ in self._intervals)
        return 100.0 * sum(y for _, y in self._intervals) / q if q else None


class StatLogger:
    def __init__(self, telemetry, interval_s: float, window: int = 6, start_thread: bool = True):
        self.tel = telemetry
        self.interval_s = interval_s
        self._last = (time.monotonic(), 0, 0.0)  # time, computed prompt tokens, generation tokens
        self._last_idle = True
        self._prefix, self._external = _HitRate(window), _HitRate(window)
        self._spec = np.zeros(3)  # drafts, draft tokens, accepted tokens at the last line
        self._spec_pos: np.ndarray | None = None  # accepted tokens per position at the last line
        self._stop = threading.Event()
        self._thread = None
        if start_thread:
            self._thread = threading.Thread(target=self._run, name="otel-llm-stat-logger", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.log()
            except Exception:  # a logging failure must not kill the thread
                logger.exception("stat logger failed")

    def log(self) -> str:
        """Emit (and return) the stat line; then the SpecDecoding line, if any (not returned)."""
        snap = self.tel.snapshot()
        c = snap.counters
        now = time.monotonic()
        prompt = self.tel.computed_prompt_tokens
        gen = float(c["otel_llm.usage.generation_tokens"].sum())
        t0, p0, g0 = self._last
        dt = max(now - t0, 1e-9)
        prompt_tps, gen_tps = (prompt - p0) / dt, (gen - g0) / dt
        self._last = (now, prompt, gen)
        hit_rate = self._prefix.update(float(c["otel_llm.prefix_cache.queries"].sum()),
                                       float(c["otel_llm.prefix_cache.hits"].sum()))
        external = self._external.update(float(c["otel_llm.external_prefix_cache.queries"].sum()),
                                         float(c["otel_llm.external_prefix_cache.hits"].sum()))
        g = snap.gauges
        by_reason = g["otel_llm.scheduler.waiting_by_reason"]
        deferred = 0 if by_reason is None else int(by_reason[1])
        cfg = self.tel.config
        engine = f"{int(cfg.engine):03d}" if cfg.engine.isdigit() else cfg.engine
        line = (f"Engine {engine}: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
                f"Avg generation throughput: {gen_tps:.1f} tokens/s, "
                f"Running: {int(g['otel_llm.scheduler.running'] or 0)} reqs, "
                f"Waiting: {int(g['otel_llm.scheduler.waiting'] or 0)} reqs, "
                + (f"Deferred: {deferred} reqs, " if deferred > 0 else "")
                + f"{cfg.kv_device} KV cache usage: {100.0 * (g['otel_llm.kv_cache.usage'] or 0.0):.1f}%, "
                f"Prefix cache hit rate: {hit_rate or 0.0:.1f}%"
                + (f", External prefix cache hit rate: {external:.1f}%" if external is not None else ""))
        idle = prompt_tps == 0 and gen_tps == 0
        level = logging.DEBUG if idle and self._last_idle else logging.INFO
        logger.log(level, "%s", line)
        spec = self._spec_line(c, dt, cfg.num_speculative_tokens)
        if spec is not None:
            logger.log(level, "%s", spec)
        self._last_idle = idle
        return line

    def _spec_line(self, c: dict, dt: float, k: int) -> str | None:
        """vLLM's SpecDecoding line for the interval since the last call; None without drafts."""
        totals = np.array([c[f"otel_llm.spec_decode.{n}"].sum() for n in ("drafts", "draft_tokens", "accepted_tokens")])
        pos = c["otel_llm.spec_decode.accepted_tokens_per_pos"]
        drafts, draft_tokens, accepted = (totals - self._spec).tolist()
        pos_delta = pos - (self._spec_pos if self._spec_pos is not None else 0)
        self._spec, self._spec_pos = totals, pos.copy()
        if drafts <= 0:
            return None
        if not k:  # not configured: up to the last position ever accepted
            seen = np.flatnonzero(pos)
            k = int(seen[-1]) + 1 if len(seen) else 0
        rates = ", ".join(f"{r:.3f}" for r in (pos_delta[:k] / drafts).tolist())
        rate = 100.0 * accepted / draft_tokens if draft_tokens > 0 else float("nan")
        return (f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, "
                f"Accepted throughput: {accepted / dt:.2f} tokens/s, Drafted throughput: {draft_tokens / dt:.2f} tokens/s, "
                f"Accepted: {int(accepted)} tokens, Drafted: {int(draft_tokens)} tokens, "
                f"Per-position acceptance rate: {rates}, Avg Draft acceptance rate: {rate:.1f}%")

    def stop(self) -> None:
        self._stop.set()
