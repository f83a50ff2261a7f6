"""The pipeline's periodic INFO log lines: vLLM-Omni's `OrchestratorAggregator` summary, per interval.

vLLM-Omni prints its orchestrator's statistics (overall e2e, per stage, per transfer edge) to
the INFO log; here they are interval lines in `stat_logger.py`'s style, computed from the
pipeline's own families (`PipelineTelemetry.family`) as deltas since the previous line, so
nothing extra is recorded on the hot path:

    Pipeline tts: Finished: 4 reqs (abort: 1, stop: 3), Running: 1 reqs, Waiting: 1 reqs,
        Avg e2e latency: 375.0 ms
    Audio 1:0: Requests: 2, Avg TTFP: 162.5 ms, Audio: 1.00 s, Avg RTF: 0.800, Avg underrun: 187.5 ms,
        Worst underrun: <= 500 ms, Continuity ok: 50.0% @100ms, 100.0% @500ms
    Audio 1:1: Requests: 0, Skipped: 1 (no_audio_data: 1)
    Transfer 0:0 -> 1:0: Hops: 2, Bytes: 4000000, Avg size: 2000000 bytes, Avg tx: 2.00 ms,
        Avg in-flight: 3.00 ms, Avg rx: 1.00 ms, Throughput: 0.40 MB/s

(each a single line). The pipeline line always comes first; then one `Audio stage:replica` line
per stage replica with audio in the interval and one `Transfer` line per edge with hops in it,
both sorted by their labels, a family's overflow series last as `(overflow)`. Field rules:
`Finished` counts finishes by reason (aborts included), `Avg e2e latency` appears when some
finished; `Requests` are the stage's finished audio responses with audio (skipped ones are
`Skipped`, by reason), `Avg TTFP` covers the first packets seen in the interval, RTF,
underrun and continuity (share of `Requests` whose worst underrun stayed <= each configured
threshold) appear when `Requests` > 0, `Worst underrun` is the highest underrun bucket hit
(`<= 25 ms`; `0 ms` when no request ran dry); `Throughput` is the edge's bytes over the
interval's wall time, in MB/s (10^6 bytes).

Families are read one snapshot at a time, so a finish landing between two reads can show in
one family's delta a line before the other's; every count still adds up over intervals.

An interval is idle when nothing finished, was transferred or streamed a first packet; when it
and the previous one are idle the lines go to DEBUG, so an idle server is silent. With the
pipeline's stats disabled nothing is logged and no thread starts. A daemon thread logs every
`interval_s`; `log()` may be called directly (from any thread: one lock guards the previous
totals). `log()` never raises: a failure is logged and counted in `failed`.
"""

from __future__ import annotations

import logging
import threading
import time

from otel_llm.canonical.cardinality import OVERFLOW_LABEL
from otel_llm.canonical.instruments import Kind
from otel_llm.pipeline.families import (
    AUDIO_CONTINUITY_OK, AUDIO_DURATION, AUDIO_RTF, AUDIO_SKIPPED, AUDIO_TTFP, AUDIO_UNDERRUN, E2E, RUNNING, SUCCESS,
    TRANSFER_IN_FLIGHT, TRANSFER_RX, TRANSFER_SIZE, TRANSFER_TX, WAITING, PipelineFamily,
)
from otel_llm.pipeline.telemetry import PipelineTelemetry

logger = logging.getLogger("otel_llm.stats")

_DELTA_FAMILIES = (SUCCESS, E2E, AUDIO_TTFP, AUDIO_DURATION, AUDIO_RTF, AUDIO_UNDERRUN, AUDIO_CONTINUITY_OK,
                   AUDIO_SKIPPED, TRANSFER_SIZE, TRANSFER_TX, TRANSFER_IN_FLIGHT, TRANSFER_RX)


def _by_key(snap) -> dict:
    """Series value by its label values after model_name; None for the overflow series."""
    return {None if pairs == (OVERFLOW_LABEL,) else tuple(v for _, v in pairs[1:]): value
            for pairs, value in snap.rows}


def _minus(cur, prev):
    if isinstance(cur, tuple):  # histogram: (bucket counts, sum)
        if prev is None:
            return cur
        return tuple(a - b for a, b in zip(cur[0], prev[0])), cur[1] - prev[1]
    return cur - (prev or 0.0)


def _count(hist) -> int:
    return sum(hist[0]) if hist else 0


def _mean(hist) -> float:
    return hist[1] / sum(hist[0])


def _order(key) -> tuple:
    return (key is None, key or ())


def _worst_bucket(hist, bounds: tuple[float, ...]) -> str:
    if hist[1] == 0:  # every observation was 0: nobody ran dry
        return "0 ms"
    top = max(i for i, c in enumerate(hist[0]) if c)
    return f"<= {bounds[top] * 1000:g} ms" if top < len(bounds) else f"> {bounds[-1] * 1000:g} ms"


def _breakdown(counts: dict[str, float]) -> str:
    return ", ".join(f"{r}: {int(c)}" for r, c in sorted(counts.items()))


class PipelineStatLogger:
    def __init__(self, pipeline: PipelineTelemetry, interval_s: float = 10.0, start_thread: bool = True,
                 clock=time.monotonic):
        """`clock`: monotonic seconds, for the throughput's interval (injectable for tests)."""
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s > 0:
            raise ValueError(f"interval_s must be a number > 0, got {interval_s!r}")
        self.pipeline = pipeline
        self.interval_s = interval_s
        self.clock = clock
        self.failed = 0  # log() calls that failed (logged with their traceback)
        self._lock = threading.Lock()
        self._last_s = clock()
        self._last_idle = True
        self._totals: dict[PipelineFamily, dict] = {f: {} for f in _DELTA_FAMILIES}
        self._stop = threading.Event()
        self._thread = None
        if start_thread and pipeline.enabled:
            self._thread = threading.Thread(target=self._run, name="otel-llm-pipeline-stat-logger", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.log()

    def log(self) -> list[str]:
        """Emit (and return) the interval's lines; [] when disabled or on failure."""
        if not self.pipeline.enabled:
            return []
        try:
            with self._lock:
                return self._log()
        except Exception:  # the log line must never break the caller or kill the thread
            self.failed += 1
            logger.exception("otel_llm: pipeline stat logger failed (interval not logged)")
            return []

    def _delta(self, family: PipelineFamily) -> dict:
        """The family's change since the last line, by key: only series that changed."""
        cur = _by_key(self.pipeline.family(family))
        prev, self._totals[family] = self._totals[family], cur
        hist = family.kind is Kind.HISTOGRAM
        out = {}
        for key, value in cur.items():
            d = _minus(value, prev.get(key))
            if (sum(d[0]) if hist else d):
                out[key] = d
        return out

    def _log(self) -> list[str]:
        now = self.clock()
        dt = now - self._last_s  # 0 (two lines at one instant): throughput 0
        self._last_s = now
        d = {f: self._delta(f) for f in _DELTA_FAMILIES}
        lines = [self._pipeline_line(d)]
        lines += self._audio_lines(d)
        lines += self._transfer_lines(d, dt)
        active = bool(d[SUCCESS] or d[TRANSFER_SIZE] or d[AUDIO_TTFP])
        level = logging.INFO if active or not self._last_idle else logging.DEBUG
        self._last_idle = not active
        for line in lines:
            logger.log(level, "%s", line)
        return lines

    def _pipeline_line(self, d: dict) -> str:
        gauge = {f: int(_by_key(self.pipeline.family(f)).get((), 0)) for f in (RUNNING, WAITING)}
        reasons = {"(overflow)" if k is None else k[0]: v for k, v in d[SUCCESS].items()}
        finished = int(sum(reasons.values()))
        e2e = d[E2E].get(())
        return (f"Pipeline {self.pipeline.config.model_name}: Finished: {finished} reqs"
                + (f" ({_breakdown(reasons)})" if finished else "")
                + f", Running: {gauge[RUNNING]} reqs, Waiting: {gauge[WAITING]} reqs"
                + (f", Avg e2e latency: {1000 * _mean(e2e):.1f} ms" if e2e else ""))

    def _audio_lines(self, d: dict) -> list[str]:
        skipped: dict = {}  # stage key -> {reason: count}
        for key, count in d[AUDIO_SKIPPED].items():
            stage, reason = (None, "(overflow)") if key is None else (key[:2], key[2])
            skipped.setdefault(stage, {})[reason] = count
        stages = set(d[AUDIO_TTFP]) | set(d[AUDIO_UNDERRUN]) | set(skipped)
        thresholds = self.pipeline.config.continuity_thresholds_ms
        lines = []
        for key in sorted(stages, key=_order):
            n = _count(d[AUDIO_UNDERRUN].get(key))
            parts = [f"Requests: {n}"]
            ttfp = d[AUDIO_TTFP].get(key)
            if ttfp:
                parts.append(f"Avg TTFP: {1000 * _mean(ttfp):.1f} ms")
            if n:
                underrun = d[AUDIO_UNDERRUN][key]
                duration = d[AUDIO_DURATION].get(key)
                rtf = d[AUDIO_RTF].get(key)
                parts += [f"Audio: {duration[1] if duration else 0.0:.2f} s",
                          f"Avg RTF: {_mean(rtf) if rtf else 0.0:.3f}",
                          f"Avg underrun: {1000 * _mean(underrun):.1f} ms",
                          f"Worst underrun: {_worst_bucket(underrun, AUDIO_UNDERRUN.buckets)}"]
                if key is not None:  # the overflow series does not keep thresholds apart
                    ok = d[AUDIO_CONTINUITY_OK]
                    parts.append("Continuity ok: " + ", ".join(
                        f"{100 * ok.get((*key, str(t)), 0) / n:.1f}% @{t}ms" for t in thresholds))
            if key in skipped:
                parts.append(f"Skipped: {int(sum(skipped[key].values()))} ({_breakdown(skipped[key])})")
            name = "(overflow)" if key is None else f"{key[0]}:{key[1]}"
            lines.append(f"Audio {name}: " + ", ".join(parts))
        return lines

    def _transfer_lines(self, d: dict, dt: float) -> list[str]:
        lines = []
        for key in sorted(d[TRANSFER_SIZE], key=_order):
            size = d[TRANSFER_SIZE][key]
            n, total = _count(size), size[1]
            ms = {f: 1000 * _mean(d[f][key]) if key in d[f] else 0.0
                  for f in (TRANSFER_TX, TRANSFER_IN_FLIGHT, TRANSFER_RX)}
            name = "(overflow)" if key is None else f"{key[0]}:{key[1]} -> {key[2]}:{key[3]}"
            mb_per_s = total / dt / 1e6 if dt > 0 else 0.0
            lines.append(f"Transfer {name}: Hops: {n}, Bytes: {int(total)}, Avg size: {total / n:.0f} bytes, "
                         f"Avg tx: {ms[TRANSFER_TX]:.2f} ms, Avg in-flight: {ms[TRANSFER_IN_FLIGHT]:.2f} ms, "
                         f"Avg rx: {ms[TRANSFER_RX]:.2f} ms, Throughput: {mb_per_s:.2f} MB/s")
        return lines

    def stop(self) -> None:
        self._stop.set()
