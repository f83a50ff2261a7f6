"""PipelineTelemetry: a multi-stage pipeline's own telemetry, at orchestrator scope (vLLM-Omni).

vLLM-Omni's Prometheus design: an orchestrator drives a request through stages (e.g. a
talker LLM, then a code2wav vocoder), each run by one of its replicas, moving data between
them over a connector. Its families (`families.py`, `vllm:omni_` by default):

- pipeline: requests running and waiting (gauges), requests finished by `finished_reason`
  (a client disconnect or cancellation counts as `abort`), end-to-end latency;
- audio, per (stage, replica): TTFP, duration, RTF, frames, worst player underrun,
  continuity per threshold, skipped requests by reason (`audio_player.py` simulates the
  listener);
- cross-stage transfer, per (from_stage, from_replica, to_stage, to_replica) edge, one
  observation per physical hop: size, sender time, receiver time, in-flight time.

The per-engine `vllm:*` families of each stage's engine come from one `Telemetry` per
(stage, replica) with `TelemetryConfig.stage_replica` set (`Profile.stage_replica`); serve them
together with these: `make_metrics_app(stage_telemetries, extra=pipeline.render)`.

Series for a (stage, replica) or an edge appear once it has data; the pipeline gauges and the
e2e histogram exist from the start (vLLM-Omni binds their model_name child at init). Stage,
replica and reason values come from outside, so each family keeps at most
`cardinality_limit` label sets, the rest going into its `otel_metric_overflow="true"` series.

Stats gate: with `PipelineConfig(enabled=False)` (vLLM-Omni's `--log-stats` off) nothing is
allocated, recorded or rendered: `render` returns b"" and `/metrics` has no omni family at all.

Threads: every method may be called from any thread (the orchestrator thread, the API event
loop); each takes the one lock of the aggregates briefly. Valid transfer hops are kept and
observed `PENDING_HOPS` at a time, and before every read. `render` copies under the lock and
formats off it. Nothing here raises into the caller: bad values are dropped and counted in
`dropped`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from otel_llm.canonical.cardinality import DEFAULT_CARDINALITY_LIMIT, check_limit
from otel_llm.engine.clock import ANCHOR_MONO_NS, ANCHOR_WALL_NS
from otel_llm.pipeline.audio_player import DEFAULT_SAMPLE_RATE, DEFAULT_THRESHOLDS_MS, PlayerResult
from otel_llm.pipeline.families import (
    AUDIO_CONTINUITY_OK, AUDIO_DURATION, AUDIO_FRAMES, AUDIO_RTF, AUDIO_SKIPPED, AUDIO_TTFP, AUDIO_UNDERRUN, E2E,
    FAMILIES, PREFIXES, RUNNING, SUCCESS, TRANSFER_IN_FLIGHT, TRANSFER_RX, TRANSFER_SIZE, TRANSFER_TX, WAITING,
    PipelineFamily,
)
from otel_llm.pipeline.hop import TransferHop
from otel_llm.pipeline.request import PipelineRequest
from otel_llm.pipeline.series import SeriesSet, series_lines

logger = logging.getLogger("otel_llm")
PENDING_HOPS = 4096  # valid hops kept before they are observed (and observed before every read)


@dataclass(frozen=True)
class PipelineConfig:
    """Configuration of a pipeline's telemetry. Invalid values raise ValueError at construction.

    - `enabled=False` (vLLM-Omni's `--log-stats` off): nothing is registered or recorded.
    - `prefix`: `vllm:omni_` (the seed's names) or `vllm_omni:` (vLLM-Omni's later rename).
    - `continuity_thresholds_ms`: one `audio_continuity_ok_total{threshold_ms}` series each.
    - `sample_rate`, `sample_width`, `channels`: the streamed PCM format (vLLM-Omni's defaults:
      24 kHz, s16le, mono); a request may give its own sample rate at `finish`.
    - `tracer_provider`: an SDK TracerProvider for the pipeline spans; None: no spans.
    """

    model_name: str
    enabled: bool = True
    prefix: str = PREFIXES[0]
    continuity_thresholds_ms: tuple[int, ...] = DEFAULT_THRESHOLDS_MS
    sample_rate: int = DEFAULT_SAMPLE_RATE
    sample_width: int = 2
    channels: int = 1
    cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT
    tracer_provider: Any = None
    provider_name: str = "otel_llm"

    def __post_init__(self):
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError(f"model_name must be a non-empty string, got {self.model_name!r}")
        if self.prefix not in PREFIXES:
            raise ValueError(f"prefix must be one of {PREFIXES}, got {self.prefix!r}")
        thresholds = self.continuity_thresholds_ms
        if (not isinstance(thresholds, tuple) or not thresholds
                or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in thresholds)):
            raise ValueError(f"continuity_thresholds_ms must be a non-empty tuple of ints > 0, got {thresholds!r}")
        for name in ("sample_rate", "sample_width", "channels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        check_limit(self.cardinality_limit)


class PipelineTelemetry:
    """The pipeline families of one model's pipeline."""

    def __init__(self, config: PipelineConfig, clock=time.monotonic_ns):
        """`clock`: the orchestrator process's monotonic ns clock (injectable for tests)."""
        self.config = config
        self.enabled = config.enabled
        self.clock = clock
        self.dropped = 0  # measurements refused: bad values, unknown stage, finished twice
        if not self.enabled:
            return
        self._lock = threading.Lock()
        self._sets = {f: SeriesSet(f, config.prefix + f.stem, config.cardinality_limit) for f in FAMILIES}
        self._running = self._waiting = 0
        self._hops: dict[tuple, list[np.ndarray]] = {}  # valid hop rows by (model, *edge), not folded yet
        self._num_hops = 0
        model = (config.model_name,)
        for f in (RUNNING, WAITING, E2E):
            self._sets[f].touch(model)
        self.anchor = (ANCHOR_WALL_NS, ANCHOR_MONO_NS) if clock is time.monotonic_ns else (time.time_ns(), clock())
        self.tracer = None
        if config.tracer_provider is not None:
            from otel_llm.pipeline.spans import PipelineTracer
            self.tracer = PipelineTracer(config.tracer_provider, config.model_name, config.provider_name, self.anchor)

    # -- request lifecycle (see PipelineRequest) -------------------------------------------

    def arrival(self, request_id: str, trace_headers: dict[str, str] | None = None, audio: bool = False,
                arrival_ns: int | None = None):
        """A request entered the pipeline (waiting until a stage starts it). Returns its
        `PipelineRequest` (a disabled one when stats are off)."""
        if not self.enabled:
            return PipelineRequest(self, request_id, 0, None, audio, live=False)
        now = self.clock() if arrival_ns is None else arrival_ns
        identity = None
        if self.tracer is not None:
            try:
                identity = self.tracer.start(trace_headers)
            except Exception:  # telemetry never breaks the request path
                logger.exception("otel_llm: pipeline span identity failed (no span for %s)", request_id)
        with self._lock:
            self._waiting += 1
        return PipelineRequest(self, request_id, now, identity, audio)

    def _gauges(self) -> None:
        """Before a read: the hops not folded yet are folded, and the running/waiting gauges take
        the counts (a snapshot; not set at every change)."""
        self._fold_hops()
        model = (self.config.model_name,)
        self._sets[RUNNING].set(model, self._running)
        self._sets[WAITING].set(model, self._waiting)

    def request_started(self) -> None:
        with self._lock:
            self._waiting -= 1
            self._running += 1

    def request_finished(self, started: bool, reason: str, e2e_s: float) -> None:
        model = self.config.model_name
        with self._lock:
            if started:
                self._running -= 1
            else:
                self._waiting -= 1
            self._sets[SUCCESS].add((model, reason), 1)
            self._sets[E2E].observe((model,), e2e_s)

    # -- observations ----------------------------------------------------------------------

    def observe_transfer(self, hop: TransferHop) -> None:
        """One physical hop: one observation in each transfer family for its edge."""
        self.observe_transfers([hop])

    def observe_transfers(self, hops: list[TransferHop]) -> None:
        """Physical hops, each one observation in each transfer family for its edge; validated and
        folded at once per edge (a request hands over its hops in batches: per token, a lock, the
        checks and four bucket searches would cost more than the token). A hop that `valid_hop`
        refuses is dropped (counted)."""
        if not self.enabled or not hops:
            return
        by_edge: dict[tuple, list] = {}
        for h in hops:
            by_edge.setdefault(h[:4], []).append(h[4:])
        for edge, group in by_edge.items():
            try:
                rows = np.array(group, np.int64)
            except (TypeError, ValueError, OverflowError):  # some hop has a value that is no integer
                rows = np.array([g for g in group if all(isinstance(x, (int, np.integer)) for x in g)], np.int64)
                self.drop(len(group) - len(rows))
            self.observe_transfer_rows(edge, rows.reshape(-1, 5))

    def observe_transfer_rows(self, edge: tuple[str, str, str, str], rows: np.ndarray) -> np.ndarray:
        """Hops on one edge (from_stage, from_replica, to_stage, to_replica) as an [n, 5] int64 array
        of (size_bytes, tx_start_ns, tx_end_ns, rx_start_ns, rx_end_ns) rows, observed at once.
        Returns the rows kept: those `valid_hop` would pass (the others are dropped, counted)."""
        if not self.enabled or not len(rows):
            return rows[:0]
        if len(edge) != 4 or not all(type(x) is str for x in edge):
            self.drop(len(rows))
            return rows[:0]
        ok = (rows[:, 0] >= 0) & (rows[:, 1] <= rows[:, 2]) & (rows[:, 2] <= rows[:, 3]) & (rows[:, 3] <= rows[:, 4])
        if not ok.all():
            self.drop(int(len(ok) - ok.sum()))
            rows = rows[ok]
        if len(rows):
            with self._lock:
                self._hops.setdefault((self.config.model_name, *edge), []).append(rows)
                self._num_hops += len(rows)
                if self._num_hops >= PENDING_HOPS:
                    self._fold_hops()
        return rows

    def _fold_hops(self) -> None:
        """Observe the hops kept since the last fold, each edge's at once (under the lock). Hops are
        kept until `PENDING_HOPS` of them are (a few requests' worth) and folded before every read:
        four bucket searches cost about the same for one hop or thousands."""
        for key, parts in self._hops.items():
            size, tx0, tx1, rx0, rx1 = (np.concatenate(parts) if len(parts) > 1 else parts[0]).T
            self._sets[TRANSFER_SIZE].observe_many(key, size.astype(np.float64))
            self._sets[TRANSFER_TX].observe_many(key, (tx1 - tx0) / 1e9)
            self._sets[TRANSFER_IN_FLIGHT].observe_many(key, (rx0 - tx1) / 1e9)
            self._sets[TRANSFER_RX].observe_many(key, (rx1 - rx0) / 1e9)
        self._hops.clear()
        self._num_hops = 0

    def observe_audio_ttfp(self, stage: str, replica: str, ttfp_s: float) -> None:
        """A request's first audio packet, `ttfp_s` after its arrival (once per request)."""
        if not self.enabled:
            return
        if not (math.isfinite(ttfp_s) and ttfp_s >= 0):
            self.drop()
            return
        with self._lock:
            self._sets[AUDIO_TTFP].observe((self.config.model_name, str(stage), str(replica)), ttfp_s)

    def observe_audio(self, stage: str, replica: str, result: PlayerResult) -> None:
        """A finished audio response (`audio_player.simulate`; TTFP is `observe_audio_ttfp`'s):
        frames, duration, RTF, underrun, continuity per threshold; or the skip, with its reason."""
        if not self.enabled:
            return
        figures = (result.duration_s, result.rtf, result.max_underrun_s)
        if result.frames < 0 or not all(math.isfinite(v) and v >= 0 for v in figures):
            self.drop()
            return
        key = (self.config.model_name, str(stage), str(replica))
        with self._lock:
            if result.skipped is not None:
                self._sets[AUDIO_SKIPPED].add((*key, str(result.skipped)), 1)
                return
            self._sets[AUDIO_FRAMES].add(key, result.frames)
            self._sets[AUDIO_DURATION].observe(key, result.duration_s)
            self._sets[AUDIO_RTF].observe(key, result.rtf)
            self._sets[AUDIO_UNDERRUN].observe(key, result.max_underrun_s)
            for threshold_ms, ok in result.continuity:
                if ok:
                    self._sets[AUDIO_CONTINUITY_OK].add((*key, str(threshold_ms)), 1)

    def drop(self, n: int = 1) -> None:
        if n:
            with self._lock:
                self.dropped += n

    # -- collection ------------------------------------------------------------------------

    def family(self, family: PipelineFamily):
        """An immutable snapshot of one family's series (`pipeline_series.SeriesSnapshot`)."""
        with self._lock:
            self._gauges()
            return self._sets[family].snapshot()

    @property
    def overflowed(self) -> dict[str, int]:
        """Measurements that went into a family's overflow series, by family name (those with any)."""
        if not self.enabled:
            return {}
        with self._lock:
            self._fold_hops()
            return {s.name: s.overflowed for s in self._sets.values() if s.overflowed}

    def render(self, openmetrics: bool = False) -> bytes:
        """The pipeline families in text format 0.0.4 or OpenMetrics, without `# EOF` (for
        `make_metrics_app(extra=...)`); b"" when disabled."""
        if not self.enabled:
            return b""
        with self._lock:
            self._gauges()
            snaps = [s.snapshot() for s in self._sets.values()]
        lines: list[str] = []
        for snap in snaps:
            series_lines(lines, snap, openmetrics)
        return ("\n".join(lines) + "\n").encode() if lines else b""
