"""Telemetry: the frontend-side facade that owns one model/engine's telemetry.

Threads: `arrival`, `ingest`, `set_output`, `fail` and `reject` are called by the
frontend (any thread; they take the lock briefly). Collection (`snapshot`,
`render`, OTel readers, the stat logger) takes the same lock only to fold what
the request table keeps (events, first tokens, finishes: `RequestTable.fold`),
flush and copy the aggregates, then works off-lock. Nothing here raises into the caller on bad
data: malformed steps, unknown handles, out-of-order events and bad values are
dropped and counted (`otel_llm.telemetry.dropped`).

With `enabled=False` every method is a no-op and nothing is allocated.

Size: one class, the facade every caller holds: each method is a few lines that take the lock and
hand the work to the request table, the engine lane, the tracer or the renderers.
"""

from __future__ import annotations

import logging
import threading
import time

from otel_llm.canonical.instruments import DIMENSIONS, request_series
from otel_llm.canonical.metrics_state import MetricsSnapshot, MetricsState
from otel_llm.engine.clock import ANCHOR_MONO_NS, ANCHOR_WALL_NS
from otel_llm.engine.step import HEADER_SIZE, FinishReason, StepRecord, outputs_only_header
from otel_llm.export.exposition import Renderer, Source
from otel_llm.export.otlp_traces import resolve_tracer_provider
from otel_llm.frontend.config import TelemetryConfig
from otel_llm.frontend.engine_lane import EngineLane
from otel_llm.frontend.lora import LoraRequests, LoraSnapshot
from otel_llm.frontend.request import RequestInfo
from otel_llm.frontend.request_spans import RequestTracer, capture_content_from_env
from otel_llm.frontend.request_table import RequestTable, operation_index
from otel_llm.frontend.triton_stats import TritonStats
from otel_llm.shim.profiles import aggregation_table
from otel_llm.shim.vllm import HIDDEN_VLLM, hidden_version
from otel_llm.slo.goodput import Goodput

logger = logging.getLogger("otel_llm")
MAX_TIMED = 65536  # requests waiting for their timings at once (`want_timings`)


class Telemetry:
    """One model/engine's request table, aggregates, tracer and statistics."""

    def __init__(self, config: TelemetryConfig, clock=time.monotonic_ns):
        """`clock`: the frontend's monotonic ns clock (injectable for tests)."""
        self.config = config
        self._clock = clock
        self.enabled = config.enabled
        if not self.enabled:
            return
        self._lock = threading.Lock()
        self.table_spec = aggregation_table(config.max_model_len, config.histogram_buckets)
        hidden = hidden_version(config.show_hidden_metrics_for_version)
        if hidden is not None and hidden not in HIDDEN_VLLM:
            logger.warning("--show-hidden-metrics-for-version %s: vLLM hid no metrics otel-llm produces then "
                           "(it does for %s); nothing added", hidden, ", ".join(HIDDEN_VLLM))
        self.metrics = MetricsState(self.table_spec)
        self.lora = LoraRequests(config.max_loras, config.cardinality_limit)
        self.triton = TritonStats(config.model_name, config.model_version)
        # the process's one anchor (`otel_llm.engine.clock`), so HTTP spans and engine times agree
        self.anchor = (ANCHOR_WALL_NS, ANCHOR_MONO_NS) if clock is time.monotonic_ns else (time.time_ns(), clock())
        self.start_time_ns = self.anchor[0]
        self._engine_anchor = self.anchor
        self.cache_config = tuple((str(k), str(v)) for k, v in sorted(config.cache_config.items()))
        if self.cache_config:
            self.metrics.gauges["otel_llm.cache_config.info"] = 1.0
        self.computed_prompt_tokens = 0  # for the log line: prompt tokens actually computed
        self.internal_errors = 0
        provider = resolve_tracer_provider(config) if config.tracing else None
        capture = capture_content_from_env() if config.capture_content is None else config.capture_content
        self.tracer = RequestTracer(provider, config.model_name, config.provider_name, capture, self.anchor) \
            if provider is not None else None
        # First tokens and finishes are folded in batches and before every read; with spans, a sampled finish
        # waits for its batch at most SPANS_WITHIN_NS (`RequestTable.fold_due`).
        self.table = RequestTable(self.metrics, fold_sampled=self.tracer is not None)
        self.lane = EngineLane(self.metrics)  # the engine's latest steps (records with a lane)
        if config.slo is not None:
            self.table.goodput = Goodput(config.slo, config.model_name)
            if not self.table.goodput.any:
                logger.warning("the SLO configuration has no objectives for model %r: its requests are not judged "
                               "(otel_llm_slo_requests stays 0)", config.model_name)
        self._renderers: dict[str, Renderer] = {}
        self._stat_logger = None
        if config.log_stats:
            from otel_llm.frontend.stat_logger import StatLogger
            self._stat_logger = StatLogger(self, config.log_stats_interval_s)

    # -- request path --------------------------------------------------------------------

    def arrival(self, info: RequestInfo) -> int:
        """Register an arriving request; returns its int64 handle (the engine's rid), -1 if disabled/full."""
        if not self.enabled:
            return -1
        now = self._clock() if info.arrival_ns is None else info.arrival_ns
        try:
            op = request_series(operation_index(info.operation), info.stream)
            trace = self.tracer.start(info, info.operation) if self.tracer else (0, 0, 0, 0)
            with self._lock:
                self.triton.on_arrival(time.time_ns() // 1_000_000)
                handle = self.table.allocate(info, op, now, trace)
                if info.lora_name and handle > 0:
                    self.lora.arrival(handle, str(info.lora_name))
                return handle
        except Exception:  # telemetry never breaks the request path
            self._internal_error("arrival")
            return -1

    def ingest(self, step: bytes | memoryview | StepRecord | None, received_ns: int | None = None) -> None:
        """Apply one engine step (bytes from `StepRecorder.end_step_bytes`, or a StepRecord).
        `received_ns`: when the frontend handled the step's output (its monotonic ns clock; it
        ends TTFT and e2e), if that was earlier than this call; default now."""
        if not self.enabled or step is None:
            return
        now = self._clock() if received_ns is None else received_ns
        if type(step) is bytes:  # the steady decode step skips decoding (see RequestTable.apply_steady)
            head = outputs_only_header(step)
            if head is not None and head[1:3] == self._engine_anchor:
                with self._lock:
                    steady = self.table.apply_steady(step, head[0], head[3], head[4])
                    if steady:
                        self.computed_prompt_tokens += head[3]
                        if head[4] != HEADER_SIZE:  # the lane, right after the header
                            self.lane.add(head[0], step)
                if steady:
                    if self.table.fold_due(now):  # (a steady step finishes none: a sampled one's wait ran out)
                        self._apply("ingest", self.table.fold)
                    if self.lane.due and self.tracer is not None:
                        self._export_lane()
                    return
        try:
            rec = step if isinstance(step, StepRecord) else StepRecord.from_bytes(step)
        except ValueError:
            with self._lock:
                self.table.dropped["bad_value"] += 1
            return

        def apply():
            self._engine_anchor = (rec.anchor_wall_ns, rec.anchor_mono_ns)
            self.computed_prompt_tokens += rec.num_computed_prompt_tokens
            lane = rec.lane
            if lane is not None:  # first: the requests this step finishes were in it
                idle = lane.running == 0 and lane.waiting == 0
                if step is rec:
                    self.lane.add(rec.step_ts_ns, lane.pack(), 0, idle)
                else:
                    self.lane.add(rec.step_ts_ns, step, HEADER_SIZE, idle)
            finished = self.table.apply(rec, now)
            lora = self.lora
            if lora.tracking and (lora.live or rec.snapshot is not None):  # only with LoRA requests or a snapshot
                lora.step(rec, (self.anchor[0] + now - self.anchor[1]) / 1e9)
            return finished

        self._apply("ingest", apply)
        if self.lane.due and self.tracer is not None:
            self._export_lane()

    def _export_lane(self) -> None:
        """The engine lane's latest window of steps, as one span (`RequestTracer.emit_lane`)."""
        try:
            with self._lock:
                cols = self.lane.take_window()
                anchor = self._engine_anchor
            if cols is not None:
                self.tracer.emit_lane(cols, anchor, self.config.engine)
        except Exception:  # telemetry never breaks the request path
            self._internal_error("lane export")

    def _apply(self, where: str, change) -> None:
        """Run `change` (returns a FinishedBatch or None) under the lock; then stats and spans."""
        try:
            steps = None
            with self._lock:
                finished = change()
                if finished is not None:
                    self.triton.on_finished(finished)
                    steps = self._step_summaries(finished)
            if finished is not None and self.tracer is not None:
                self.tracer.emit(finished, self._engine_anchor, steps)
        except Exception:  # telemetry never breaks the request path
            self._internal_error(where)

    @property
    def capture_content(self) -> bool:
        """Whether spans record prompt and response content (opt-in: config or
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT); callers skip building it otherwise."""
        return self.enabled and self.tracer is not None and self.tracer.capture_content

    def set_output(self, handle: int, text: str | list[str]) -> None:
        """Response text (one per choice) for content capture; call before ingesting the finishing step."""
        if not self.capture_content:
            return
        with self._lock:
            slot = self.table.slot_of(handle)
            if slot is not None:
                self.table.outputs[slot] = [text] if isinstance(text, str) else list(text)

    def fail(self, handle: int, reason: FinishReason = FinishReason.ERROR) -> None:
        """Finish a request from the frontend (engine died, or it never reached the engine)."""
        if not self.enabled:
            return

        def change():
            if self.lora.live:
                self.lora.finish(handle)
            return self.table.finish_from_frontend(handle, reason, self._clock())

        self._apply("fail", change)

    def want_timings(self, handle: int) -> None:
        """Keep this request's `timings` (`otel_llm.frontend.timings`) when it finishes, for `pop_timings`
        (a response that returns them). At most MAX_TIMED requests are kept: beyond, the oldest is
        forgotten (one whose response never asked for its timings cannot hold a place forever)."""
        if not self.enabled or handle <= 0:
            return
        with self._lock:
            timed = self.table.timed
            if len(timed) >= MAX_TIMED:
                del timed[next(iter(timed))]
            timed[handle] = None

    def pop_timings(self, handle: int) -> dict | None:
        """A request's `timings` once its finish was ingested (None before, or if none were kept);
        forgets the request either way, so call it once, when its response ends."""
        if not self.enabled or handle <= 0:
            return None
        with self._lock:
            return self.table.timed.pop(handle, None)

    def engine_gone(self) -> None:
        """The engine is gone (died, hung, being restarted): its scheduler gauges (running,
        waiting, KV-cache usage) read 0 until it reports again, not its last values."""
        if not self.enabled:
            return
        with self._lock:
            self.table.engine_gone()

    def reject(self, reason: str) -> None:
        """A request refused at admission, before it was registered (vLLM's `record_admission_rejection`):
        counted in `otel_llm.admission.rejections` by `reason` (`max_num_queued_reqs` or
        `max_num_queued_tokens`); another reason is dropped and counted, never raised."""
        if not self.enabled:
            return
        reasons = DIMENSIONS["otel_llm.rejection_reason"]
        with self._lock:
            if reason in reasons:
                self.metrics.add("otel_llm.admission.rejections", 1, reasons.index(reason))
            else:
                self.table.dropped["bad_value"] += 1

    def _internal_error(self, where: str) -> None:
        self.internal_errors += 1
        if self.internal_errors <= 10:
            logger.exception("otel_llm: internal error in %s (dropped; %d so far)", where, self.internal_errors)

    def _step_summaries(self, finished) -> dict | None:
        """The engine-lane summaries of the finished requests a span will show (`EngineLane.summaries`)."""
        if self.tracer is None or not finished.trace[:, 2].any():  # no sampled request among them
            return None
        return self.lane.summaries(finished.sched, finished.first, finished.last)

    # -- collection ----------------------------------------------------------------------

    def _fold(self) -> None:
        """Fold what the table keeps into the aggregates (under the lock; see `RequestTable.fold`)."""
        self.lane.flush()
        finished = self.table.fold()
        if finished is not None:
            self.triton.on_finished(finished)
            if self.tracer is not None:
                self.tracer.emit(finished, self._engine_anchor, self._step_summaries(finished))
        self.table.judge()

    def snapshot(self, exemplars: bool = True) -> MetricsSnapshot:
        with self._lock:
            self._fold()
            self.metrics.counters["otel_llm.telemetry.dropped"][0] = sum(self.table.dropped.values()) + self.lane.dropped
            return self.metrics.snapshot(time.time_ns(), exemplars)

    def lora_snapshot(self) -> LoraSnapshot | None:
        with self._lock:
            return self.lora.snapshot()

    def source(self, exemplars: bool = True) -> Source:
        """What a render reads; `exemplars=False` for one that does not show them (text format 0.0.4)."""
        stage, replica = self.config.stage_replica or ("", "")
        return Source(self.snapshot(exemplars), self.table_spec, self.config.model_name, self.config.engine, self.cache_config,
                      self.config.model_version, self.lora_snapshot(), stage=stage, replica=replica)

    def render(self, openmetrics: bool = False, profile: str | None = None) -> bytes:
        """This Telemetry's exposition (`profile` defaults to config.metrics_compat)."""
        if not self.enabled:
            return b"# EOF\n" if openmetrics else b""
        name = profile or self.config.metrics_compat
        renderer = self._renderers.get(name)
        if renderer is None:
            renderer = self._renderers[name] = Renderer(self.config.profile(name), self.config.cardinality_limit)
        return renderer.render([self.source(exemplars=openmetrics)], openmetrics)

    @property
    def metrics_app(self):
        """ASGI app serving this Telemetry's `/metrics` (content negotiation)."""
        from otel_llm.export.asgi import make_metrics_app
        return make_metrics_app([self], self.config.metrics_compat)

    def model_statistics(self) -> dict:
        """Triton `$model_stat` for this model/version."""
        with self._lock:
            self._fold()
            return self.triton.model_stat(self.table)

    def attach_reader(self, reader, resource=None, producers=()) -> None:
        """Make a standard OTel MetricReader (OTLP periodic, in-memory, ...) collect this Telemetry (and `producers`'
        metrics: `metric_producer.to_metrics_data`); `resource` (an SDK Resource) describes the process."""
        from otel_llm.export.metric_producer import attach_reader
        attach_reader(reader, [self], resource, producers=producers)

    def shutdown(self) -> None:
        if not self.enabled:
            return
        if self._stat_logger is not None:
            self._stat_logger.stop()
        with self._lock:
            self._fold()
        if self.tracer is not None:
            self._export_lane()
            if self.config.tracer_provider is None:  # its own; a given one is its owner's
                self.tracer.provider.force_flush()
