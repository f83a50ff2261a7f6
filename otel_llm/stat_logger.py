"""The periodic INFO stat line, in vLLM's `LoggingStatLogger` format.

    Engine 000: Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: 240.1 tokens/s,
    Running: 8 reqs, Waiting: 0 reqs, GPU KV cache usage: 31.2%, Prefix cache hit rate: 45.0%

Prompt throughput counts computed prompt tokens only (cached ones excluded), as
vLLM does. The prefix-cache hit rate is over a recent window: the last
`window` log intervals (vLLM uses its last 1000 requests). When the current and
the previous interval both had zero throughput the line drops to DEBUG, so an
idle server is silent. A daemon thread logs every `interval_s`; `log()` can
also be called directly.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

logger = logging.getLogger("otel_llm.stats")


class StatLogger:
    def __init__(self, telemetry, interval_s: float, window: int = 6, start_thread: bool = True):
        self.tel = telemetry
        self.interval_s = interval_s
        self._last = (time.monotonic(), 0, 0.0)  # time, computed prompt tokens, generation tokens
        self._last_idle = True
        self._prefix = collections.deque(maxlen=window)  # (queries, hits) per interval
        self._prefix_total = (0.0, 0.0)
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
        """Emit (and return) one stat line."""
        snap = self.tel.snapshot()
        now = time.monotonic()
        prompt = self.tel.computed_prompt_tokens
        gen = float(snap.counters["otel_llm.usage.generation_tokens"].sum())
        t0, p0, g0 = self._last
        dt = max(now - t0, 1e-9)
        prompt_tps, gen_tps = (prompt - p0) / dt, (gen - g0) / dt
        self._last = (now, prompt, gen)
        q = float(snap.counters["otel_llm.prefix_cache.queries"].sum())
        h = float(snap.counters["otel_llm.prefix_cache.hits"].sum())
        self._prefix.append((q - self._prefix_total[0], h - self._prefix_total[1]))
        self._prefix_total = (q, h)
        wq = sum(x for x, _ in self._prefix)
        hit_rate = 100.0 * sum(y for _, y in self._prefix) / wq if wq else 0.0
        g = snap.gauges
        cfg = self.tel.config
        engine = f"{int(cfg.engine):03d}" if cfg.engine.isdigit() else cfg.engine
        line = (f"Engine {engine}: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
                f"Avg generation throughput: {gen_tps:.1f} tokens/s, "
                f"Running: {int(g['otel_llm.scheduler.running'] or 0)} reqs, "
                f"Waiting: {int(g['otel_llm.scheduler.waiting'] or 0)} reqs, "
                f"{cfg.kv_device} KV cache usage: {100.0 * (g['otel_llm.kv_cache.usage'] or 0.0):.1f}%, "
                f"Prefix cache hit rate: {hit_rate:.1f}%")
        idle = prompt_tps == 0 and gen_tps == 0
        logger.log(logging.DEBUG if idle and self._last_idle else logging.INFO, "%s", line)
        self._last_idle = idle
        return line

    def stop(self) -> None:
        self._stop.set()
