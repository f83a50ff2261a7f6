"""PipelineTelemetry: a multi-stage pipeline's own telemetry, at orchestrator scope (vLLM-Omni).

vLLM-Omni's Prometheus design: an orchestrator drives a request through stages (e.g. a
talker LLM, then a code2wav vocoder), each run by one of its replicas, moving data between
them over a connector. Its families (`families.py`, `vllm_omni:` by default):

- pipeline: requests running and waiting (gauges), requests finished by `finished_reason`
  (a failed request counts as `abort`, and by its reason in `requests_failed`), end-to-end
  latency, queue wait (arrival to the first stage's start), prompt and generation tokens (of
  completed requests), speech streams completed and aborted (by reason);
- per stage: generation time (each visit that ended, by `stage_type`), in-queue time (enqueued
  to started, where the stage says when it was enqueued), waiting requests (the sum over its
  replicas of their latest scheduler snapshot, pushed or read from a source at every read);
- audio, per (stage, replica): TTFP, duration, RTF, frames, worst player underrun,
  continuity per threshold, skipped requests by reason (`audio_player.py` simulates the
  listener);
- cross-stage transfer, per (from_stage, from_replica, to_stage, to_replica) edge, one
  observation per physical hop: size, sender time, receiver time, in-flight time.

The per-engine `vllm:*` families of each stage's engine come from one `Telemetry` per
(stage, replica) with `TelemetryConfig.stage_replica` set (`Profile.stage_replica`); serve them
together with these: `make_metrics_app(stage_telemetries, extra=pipeline.render)`.

Series for a (stage, replica) or an edge appear once it has data; the pipeline gauges, the
e2e and queue-wait histograms and the token counters exist from the start (vLLM-Omni binds
their model_name child at init). Stage, replica and reason values come from outside, so each
family keeps at most `cardinality_limit` label sets, the rest going into its
`otel_metric_overflow="true"` series; failure and stream-abort reasons are bounded to
vLLM-Omni's vocabularies (another becomes `unknown` / `error`, as there).

Stats gate: with `PipelineConfig(enabled=False)` (vLLM-Omni's `--log-stats` off) nothing is
allocated, recorded or rendered: `render` returns b"" and `/metrics` has no omni family at all.

Threads: every method may be called from any thread (the orchestrator thread, the API event
loop); each takes the one lock of the aggregates briefly. Valid transfer hops are kept and
observed `PENDING_HOPS` at a time, and before every read. `render` copies under the lock and
formats off it. Nothing here raises into the caller: bad values are dropped and counted in
`dropped`.

Size: over 320 lines because it is the one owner of the pipeline's families and their lock:
every observation (request, stage, audio, transfer, stream) lands here and is read here.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import numpy as np

from otel_llm.canonical.cardinality import DEFAULT_CARDINALITY_LIMIT, check_limit
from otel_llm.engine.clock import ANCHOR_MONO_NS, ANCHOR_WALL_NS
from otel_llm.pipeline.audio_player import DEFAULT_SAMPLE_RATE, DEFAULT_THRESHOLDS_MS, PlayerResult
from otel_llm.pipeline.families import (
    AUDIO_CONTINUITY_OK, AUDIO_DURATION, AUDIO_FRAMES, AUDIO_RTF, AUDIO_SKIPPED, AUDIO_TTFP, AUDIO_UNDERRUN, E2E,
    FAILED, FAILURE_REASONS, FAMILIES, GENERATION_TOKENS, PREFIXES, PROMPT_TOKENS, QUEUE_WAIT, RUNNING, STAGE_GEN_TIME,
    STAGE_IN_QUEUE, STAGE_TYPES, STAGE_WAITING, STREAM_ABORT_REASONS, STREAM_ABORTED, STREAM_COMPLETED, SUCCESS,
    TRANSFER_IN_FLIGHT, TRANSFER_RX, TRANSFER_SIZE, TRANSFER_TX, WAITING, PipelineFamily,
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
    - `prefix`: `vllm_omni:` (vLLM-Omni's) or `vllm:omni_` (its design's first release).
    - `diffusion_stages`: the stages whose `stage_type` is `diffusion` (the others' is `llm`).
    - `continuity_thresholds_ms`: one `audio_continuity_ok_total{threshold_ms}` series each.
    - `sample_rate`, `sample_width`, `channels`: the streamed PCM format (vLLM-Omni's defaults:
      24 kHz, s16le, mono); a request may give its own sample rate at `finish`.
    - `tracer_provider`: an SDK TracerProvider for the pipeline spans; None: no spans.
    """

    model_name: str
    enabled: bool = True
    prefix: str = PREFIXES[0]
    diffusion_stages: tuple[str, ...] = ()
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
        if not isinstance(self.diffusion_stages, tuple) or not all(type(s) is str for s in self.diffusion_stages):
            raise ValueError(f"diffusion_stages must be a tuple of stage names, got {self.diffusion_stages!r}")
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
        self._waiting_at: dict[tuple[str, str], int] = {}  # (stage, replica) -> its latest waiting snapshot
        self._waiting_sources: dict[tuple[str, str], Callable[[], int]] = {}
        model = (config.model_name,)
        for f in (RUNNING, WAITING, E2E, QUEUE_WAIT, PROMPT_TOKENS, GENERATION_TOKENS):
            self._sets[f].touch(model)
        self.anchor = (ANCHOR_WALL_NS, ANCHOR_MONO_NS) if clock is time.monotonic_ns else (time.time_ns(), clock())
        self.start_time_ns = time.time_ns()  # the start of its cumulative series
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
        """Before a read: the hops not folded yet are folded, and the gauges take the counts (a
        snapshot; not set at every change): running and waiting, and each stage's waiting requests
        (its replicas' latest snapshots, the sources read now)."""
        self._fold_hops()
        model = self.config.model_name
        self._sets[RUNNING].set((model,), self._running)
        self._sets[WAITING].set((model,), self._waiting)
        for at, source in self._waiting_sources.items():
            try:
                self._snapshot_at(at, _count(source()))
            except Exception:  # a source that fails or returns no count keeps its last snapshot
                self.dropped += 1
        stages: dict[str, int] = {}
        for (stage, _), n in self._waiting_at.items():
            stages[stage] = stages.get(stage, 0) + n
        for stage, n in stages.items():
            self._sets[STAGE_WAITING].set((model, stage), n)

    def request_started(self) -> None:
        with self._lock:
            self._waiting -= 1
            self._running += 1

    def request_finished(self, started: bool, reason: str, e2e_s: float, queue_wait_s: float | None = None,
                         prompt_tokens: int = 0, generation_tokens: int = 0) -> None:
        """A request completed (`PipelineRequest.finish`): its finish reason, e2e latency, queue wait
        (None: no stage started it) and tokens (checked by the caller)."""
        model = (self.config.model_name,)
        with self._lock:
            self._left(started)
            self._sets[SUCCESS].add((*model, reason), 1)
            self._sets[E2E].observe(model, e2e_s)
            if queue_wait_s is not None:
                self._sets[QUEUE_WAIT].observe(model, queue_wait_s)
            if prompt_tokens:
                self._sets[PROMPT_TOKENS].add(model, prompt_tokens)
            if generation_tokens:
                self._sets[GENERATION_TOKENS].add(model, generation_tokens)

    def request_failed(self, started: bool, reason: str) -> None:
        """A request ended without completing (`PipelineRequest.fail`): `abort` among the finish
        reasons, and its failure reason (one of `FAILURE_REASONS`, else `unknown`)."""
        model = self.config.model_name
        with self._lock:
            self._left(started)
            self._sets[SUCCESS].add((model, "abort"), 1)
            self._sets[FAILED].add((model, reason if reason in FAILURE_REASONS else "unknown"), 1)

    def _left(self, started: bool) -> None:
        if started:
            self._running -= 1
        else:
            self._waiting -= 1

    # -- stages ----------------------------------------------------------------------------

    def observe_stage_gen_time(self, stage: str, gen_time_s: float) -> None:
        """A stage's visit of a request ended after `gen_time_s` seconds of generation."""
        self._observe_stage(STAGE_GEN_TIME, (str(stage), self.stage_type(stage)), gen_time_s)

    def observe_stage_in_queue(self, stage: str, in_queue_s: float) -> None:
        """A stage started on a request `in_queue_s` seconds after it was enqueued there."""
        self._observe_stage(STAGE_IN_QUEUE, (str(stage),), in_queue_s)

    def _observe_stage(self, family: PipelineFamily, key: tuple[str, ...], seconds: float) -> None:
        if not self.enabled:
            return
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
            self.drop()
            return
        with self._lock:
            self._sets[family].observe((self.config.model_name, *key), seconds)

    def stage_type(self, stage: str) -> str:
        return STAGE_TYPES[1] if stage in self.config.diffusion_stages else STAGE_TYPES[0]

    def stage_waiting(self, stage: str, replica: str, waiting: int) -> None:
        """A (stage, replica)'s scheduler snapshot: `waiting` requests now. The stage's
        `stage_waiting_requests` is the sum of its replicas' latest."""
        if not self.enabled:
            return
        try:
            n = _count(waiting)
        except ValueError:
            self.drop()
            return
        with self._lock:
            self._snapshot_at((str(stage), str(replica)), n)

    def _snapshot_at(self, at: tuple[str, str], n: int) -> None:
        """Keep a (stage, replica)'s waiting snapshot; a new one beyond the cardinality limit is dropped."""
        if at not in self._waiting_at and len(self._waiting_at) >= self.config.cardinality_limit:
            self.dropped += 1
        else:
            self._waiting_at[at] = n

    def watch_stage_waiting(self, stage: str, replica: str, source: Callable[[], int]) -> None:
        """Read the (stage, replica)'s waiting requests from `source()` at every read instead of
        being told (`stage_waiting`): a cheap call that never calls into this telemetry; one that
        raises or returns no count keeps the last snapshot (counted in `dropped`)."""
        if self.enabled:
            with self._lock:
                if len(self._waiting_sources) < self.config.cardinality_limit:
                    self._waiting_sources[(str(stage), str(replica))] = source
                else:
                    self.dropped += 1

    # -- speech streams --------------------------------------------------------------------

    def stream_completed(self) -> None:
        """A streamed speech response ended normally (its last chunk was written)."""
        if self.enabled:
            with self._lock:
                self._sets[STREAM_COMPLETED].add((self.config.model_name,), 1)

    def stream_aborted(self, reason: str) -> None:
        """A streamed speech response ended early: `closed` or `cancelled` (the client went away),
        `engine_dead`, or `error` (also for a reason not among those)."""
        if self.enabled:
            reason = reason if reason in STREAM_ABORT_REASONS else "error"
            with self._lock:
                self._sets[STREAM_ABORTED].add((self.config.model_name, reason), 1)

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

    def _snapshots(self) -> list:
        with self._lock:
            self._gauges()
            return [s.snapshot() for s in self._sets.values()]

    def render(self, openmetrics: bool = False, profile: str = "vllm") -> bytes:
        """The pipeline families in text format 0.0.4 or OpenMetrics, without `# EOF` (for
        `make_metrics_app(extra=...)`); b"" when disabled. Profile `otel`: under their OTel names
        and attributes (`families.PipelineFamily.otel`); any other: vLLM-Omni's."""
        if not self.enabled:
            return b""
        lines: list[str] = []
        for snap in self._snapshots():
            series_lines(lines, snap, openmetrics, otel=profile == "otel")
        return ("\n".join(lines) + "\n").encode() if lines else b""

    def to_metrics(self) -> list:
        """The families as OTel `Metric`s (`otlp.to_metrics`): what a reader collects; a producer for
        `metric_producer.attach_reader(..., producers=[pipeline.to_metrics])`."""
        if not self.enabled:
            return []
        from otel_llm.pipeline.otlp import to_metrics
        return to_metrics(self._snapshots(), self.start_time_ns, time.time_ns())

def _count(value) -> int:
    """A number of requests: an int >= 0 (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"not a count of requests: {value!r}")
    return int(value)
