"""vLLM's per-step stats objects folded into otel_llm's vectorised aggregation (vLLM not imported).

vLLM hands a stat logger, once per engine step on its API server's event loop,
a `SchedulerStats` and an `IterationStats` (per-step lists of TTFTs and ITLs,
`FinishedRequestStats` with durations). `record` only queues the objects
(one deque append: vLLM builds new ones every step and never touches them
again); `flush` folds every queued step into per-engine `MetricsState`s with a
handful of numpy operations per histogram, whatever the number of steps,
tokens or finished requests. So a token costs a share of one `np.array` and
one `searchsorted`, and a step that finishes one request does not pay a
dozen per-request histogram calls. The queue is bounded: `record` flushes
itself every `flush_every` steps.

Values follow vLLM's `PrometheusStatLogger.record` exactly (what it observes,
and when); the canonical instruments (`instruments.py`) carry them, with
`gen_ai.operation.name="_OTHER"` (vLLM's stats do not say chat or
completion): also the waiting requests by reason, prompt tokens by source,
the KV connector's prefix cache and speculative decoding, so OTLP has them.
The one family vLLM serves that has no canonical instrument (`Extras`: the
recomputed prompt tokens of vLLM 0.16 to 0.19) is kept per engine beside them.
Fields a vLLM release lacks (`otel_llm.vllm.compat` lists them) read as that release means.

Size: the three stats objects' folds share the per-engine state and the queue; apart they would
pass both around.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

import numpy as np

from otel_llm.canonical.aggregation import HistogramState
from otel_llm.canonical.instruments import (
    DIMENSIONS, OPERATIONS, PERF_COUNTERS, SLEEP_STATE, Instrument, instrument_table, request_series,
)
from otel_llm.canonical.metrics_state import MetricsSnapshot, MetricsState
from otel_llm.canonical.step_stats import add_prefix_cache, add_spec_decoding, fold_kv_evictions, set_scheduler
from otel_llm.engine.step import FinishReason
from otel_llm.frontend.config import TelemetryConfig
from otel_llm.slo.config import SloConfig
from otel_llm.slo.goodput import GOODPUT, Goodput

logger = logging.getLogger("vllm.otel_llm")  # under vLLM's configured "vllm" logger

OP_OTHER = request_series(len(OPERATIONS) - 1, False)  # "_OTHER", not known to stream
# vLLM's engine_sleep_state (awake, weights_offloaded, discard_all) at sleep level 0, 1, 2; last: asleep, level unknown
_SLEEP = (np.array((1.0, 0.0, 0.0)), np.array((0.0, 1.0, 0.0)), np.array((0.0, 0.0, 1.0)), np.zeros(3))
NUM_REASONS = len(FinishReason)
# FinishedRequestStats fields, one row per request: reason, then vLLM's observation order.
_FINISHED_FIELDS = ("finish_reason", "e2e_latency", "queued_time", "prefill_time", "inference_time", "decode_time",
                    "num_preemptions", "num_prompt_tokens", "num_generation_tokens", "mean_time_per_output_token",
                    "max_tokens_param", "num_cached_tokens")
_FINISHED = attrgetter(*_FINISHED_FIELDS)
# IterationStats / PromptTokenStats fields read once per step (vLLM 0.16 on: `prompt_token_stats`;
# before, the prompt tokens of a step were one number, `num_prompt_tokens`).
_ITERATION_FIELDS = ("num_generation_tokens", "num_preempted_reqs", "max_num_generation_tokens_iter", "n_params_iter",
                     "time_to_first_tokens_iter", "inter_token_latencies_iter", "finished_requests")
_ITERATION = attrgetter(*_ITERATION_FIELDS, "prompt_token_stats")
_ITERATION_BEFORE_0_16 = attrgetter(*_ITERATION_FIELDS, "num_prompt_tokens")
_PROMPT = attrgetter("total", "computed", "local_cache_hit", "external_kv_transfer", "cached_tokens")
_PERF = attrgetter("num_flops_per_gpu", "num_read_bytes_per_gpu", "num_write_bytes_per_gpu")
_SPEC = attrgetter("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
_COLUMN = {name: i for i, name in enumerate(_FINISHED_FIELDS)}
# canonical histogram <- its FinishedRequestStats column
_PER_REQUEST = tuple((inst, _COLUMN[f]) for inst, f in (
    ("gen_ai.server.request.duration", "e2e_latency"), ("otel_llm.request.queue.duration", "queued_time"),
    ("otel_llm.request.prefill.duration", "prefill_time"), ("otel_llm.request.inference.duration", "inference_time"),
    ("otel_llm.request.decode.duration", "decode_time"), ("otel_llm.request.preemptions", "num_preemptions"),
    ("otel_llm.request.prompt_tokens", "num_prompt_tokens"),
    ("otel_llm.request.generation_tokens", "num_generation_tokens"),
    ("gen_ai.server.time_per_output_token", "mean_time_per_output_token")))


@dataclass
class Extras:
    """Per-engine values of vLLM families that have no canonical instrument."""

    recomputed: float = 0.0  # vllm:prompt_tokens_recomputed (vLLM 0.16 to 0.19)


class EngineStats:
    """One engine index's aggregates; duck-types what `bridge.to_metrics` reads from a Telemetry."""

    enabled = True
    cache_config: tuple[tuple[str, str], ...] = ()

    def __init__(self, config: TelemetryConfig, table: dict[str, Instrument], lock: threading.Lock,
                 flush) -> None:
        self.config = config
        self.table_spec = table
        self.metrics = MetricsState(table, seconds_in_ns=False)
        self.extras = Extras()
        self.goodput: Goodput | None = None
        self.start_time_ns = time.time_ns()
        self._lock = lock
        self._flush = flush

    def settle(self) -> None:
        """Bucket every buffered value (under the aggregator's lock)."""
        self.metrics.flush(0)

    def snapshot(self) -> MetricsSnapshot:
        self._flush()
        with self._lock:
            return self.metrics.snapshot(time.time_ns())


class VllmStatsAggregator:
    """vLLM stats in, per-engine canonical aggregates out. `record` is the event-loop path."""

    def __init__(self, model_name: str, max_model_len: int, engine_indexes=(0,), flush_every: int = 256,
                 extra_buckets: dict[str, tuple[float, ...]] | None = None, provider_name: str = "vllm",
                 scheduler_gauges: bool = True, vllm_families: bool = True, kv_cache_metrics: bool = False,
                 step_tokens_computed: bool = True, slo: SloConfig | None = None, mfu_metrics: bool = False) -> None:
        """`extra_buckets`: canonical instrument -> boundaries to add (a vLLM family's custom buckets,
        so that it can be re-bucketed exactly). `scheduler_gauges=False`: leave the running/waiting/
        KV-usage gauges unset (another process exports them). `vllm_families=False`: keep only the
        canonical instruments, not the `Extras` that only vLLM's own families show (`add` mode, where
        vLLM's logger serves those). `on_steps(engine_idx, steps)`, if set, also sees every folded step
        (under the lock). `kv_cache_metrics`: vLLM's `--kv-cache-metrics` is on (its residency
        histograms are exported). `step_tokens_computed`: a step's tokens count the prompt tokens it
        computed (vLLM 0.23 on), else every prompt token it scheduled (before). `slo`: objectives each
        finished request is judged against (goodput, `otel_llm.slo.requests`). `mfu_metrics`: vLLM's
        this vLLM declares its MFU estimate families (0.17 on; at 0 until `--enable-mfu-metrics` gives
        its steps `perf_stats`, which are summed into `otel_llm.engine.estimated_*`)."""
        table = instrument_table(max_model_len)
        for name, bounds in (extra_buckets or {}).items():
            inst = table[name]
            table[name] = Instrument(inst.name, inst.kind, inst.unit, inst.description,
                                     tuple(sorted(set(inst.buckets) | set(bounds))), inst.dims, inst.exemplars)
        self.table = table
        self._model, self._provider, self._max_len = model_name, provider_name, max_model_len
        self._lock = threading.Lock()
        self.scheduler_gauges, self.vllm_families = scheduler_gauges, vllm_families
        self.kv_cache_metrics, self.step_tokens_computed = kv_cache_metrics, step_tokens_computed
        self.mfu_metrics = mfu_metrics
        self.on_steps = None
        self.lane = None  # an `otel_llm.vllm.lane.VllmLane` the steps also go to
        self.slo = slo
        self.goodput = None if slo is None else Goodput(slo, model_name, scale=1.0)  # vLLM's stats are in seconds
        self._pending: collections.deque = collections.deque()
        self.flush_every = flush_every
        self.engines: dict[int, EngineStats] = {}
        for idx in engine_indexes:
            self.engine(idx)
        self.errors = 0
        # steps lost to unreadable stats objects (counted; the first error logged), steps whose
        # per-position spec decoding counts had more than MAX_SPEC_POSITIONS positions (left out),
        # and admission rejections with an unknown reason
        self.dropped = 0

    def engine(self, idx: int) -> EngineStats:
        e = self.engines.get(idx)
        if e is None:
            config = TelemetryConfig(self._model, engine=str(idx), max_model_len=self._max_len, log_stats=False,
                                     tracing=False, provider_name=self._provider,
                                     kv_cache_metrics=self.kv_cache_metrics, slo=self.slo, mfu_metrics=self.mfu_metrics)
            e = self.engines[idx] = EngineStats(config, self.table, self._lock, self.flush)
            e.goodput = self.goodput
            e.metrics.gauges[SLEEP_STATE] = _SLEEP[0].copy()  # awake, as vLLM's logger starts
        return e

    def sleep(self, sleep: int = 0, level: int = 0) -> None:
        """vLLM's `record_sleep_state` for every engine: asleep at level 1 (weights offloaded) or 2
        (all discarded), else awake. Never raises."""
        state = _SLEEP[0] if sleep != 1 else _SLEEP[level] if level in (1, 2) else _SLEEP[3]
        with self._lock:
            for e in self.engines.values():
                e.metrics.gauges[SLEEP_STATE] = state.copy()

    def cache_config(self, info: dict) -> None:
        """vLLM's `CacheConfig.metrics_info()` on each engine's `otel_llm.cache_config.info` point."""
        pairs = tuple(sorted((str(k), str(v)) for k, v in info.items()))
        with self._lock:
            for e in self.engines.values():
                e.cache_config = pairs
                e.metrics.gauges["otel_llm.cache_config.info"] = 1.0

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        """Queue one step's stats (vLLM's `StatLoggerBase.record` signature). Never raises."""
        try:
            self._pending.append((engine_idx, scheduler_stats, iteration_stats, mm_cache_stats))
            if len(self._pending) >= self.flush_every:
                self.flush()
        except Exception:
            self._failed("record")

    def flush(self) -> None:
        """Fold every queued step into the aggregates. Never raises."""
        pending = self._pending
        if not pending:
            return
        with self._lock:
            steps = [pending.popleft() for _ in range(len(pending))]
            try:
                engines = {s[0] for s in steps}
                for idx in engines:
                    mine = steps if len(engines) == 1 else [s for s in steps if s[0] == idx]
                    self._fold(self.engine(idx), mine)
                    if self.on_steps is not None:
                        self.on_steps(idx, mine)
            except Exception:  # an unreadable stats object: its batch is dropped and counted
                self.dropped += len(steps)
                self._failed("flush")
            if self.lane is not None:
                self._lane(steps, engines)
            first = next(iter(self.engines.values()), None)
            if first is not None:
                first.metrics.counters["otel_llm.telemetry.dropped"][0] = self.dropped

    def _lane(self, steps: list, engines: set) -> None:
        try:
            for idx in engines:
                self.lane.add(idx, steps if len(engines) == 1 else [s for s in steps if s[0] == idx])
            self.lane.export()
        except Exception:  # the lane is off from here on; the metrics go on
            self.lane = None
            self._failed("engine lane")

    @contextlib.contextmanager
    def settled(self):
        """Every queued step folded and buffered value bucketed (what a collection pays); the lock held."""
        self.flush()
        with self._lock:
            for e in self.engines.values():
                e.settle()
            yield

    def settle(self) -> None:
        with self.settled():
            pass

    def reject(self, reason: str) -> None:
        """One frontend admission rejection (vLLM's `record_admission_rejection`), counted on the first
        engine's state (the family has no engine label); an unknown reason is dropped and counted. Never raises."""
        reasons = DIMENSIONS["otel_llm.rejection_reason"]
        with self._lock:
            first = next(iter(self.engines.values()))
            if reason in reasons:
                first.metrics.add("otel_llm.admission.rejections", 1, reasons.index(reason))
            else:
                self.dropped += 1
                first.metrics.counters["otel_llm.telemetry.dropped"][0] = self.dropped

    def _failed(self, where: str) -> None:
        self.errors += 1
        if self.errors == 1:
            logger.exception("otel-llm: error in the vLLM stat logger's %s (logged once, counted; vLLM unaffected)",
                             where)

    # -- folding ---------------------------------------------------------------------------

    def _fold(self, e: EngineStats, steps: list) -> None:
        scheds = [s[1] for s in steps if s[1] is not None]
        if scheds:
            self._scheduler(e, scheds)
        mm = [s[3] for s in steps if s[3] is not None]
        if mm:
            e.metrics.add("otel_llm.mm_cache.queries", sum(m.queries for m in mm))
            e.metrics.add("otel_llm.mm_cache.hits", sum(m.hits for m in mm))
        its = [s[2] for s in steps if s[2] is not None]
        if its:
            self._iterations(e, its)

    def _scheduler(self, e: EngineStats, scheds: list) -> None:
        m, last = e.metrics, scheds[-1]
        if self.scheduler_gauges:
            skipped = getattr(last, "num_skipped_waiting_reqs", 0)  # vLLM 0.20 on
            set_scheduler(m, last.num_running_reqs, last.num_waiting_reqs + skipped, skipped, last.kv_cache_usage)
        pcs = [s.prefix_cache_stats for s in scheds]
        hits = sum(p.hits for p in pcs)
        connector = [c for c in (s.connector_prefix_cache_stats for s in scheds) if c is not None]
        tiers = None  # the connector's hits by cache tier (vLLM 0.32 on)
        if connector and hasattr(connector[0], "hits_by_source"):
            tiers = collections.Counter()
            for c in connector:
                tiers.update({getattr(t, "value", str(t)): n for t, n in (c.hits_by_source or {}).items()})
        add_prefix_cache(m, sum(p.queries for p in pcs), hits, sum(c.queries for c in connector),
                         sum(c.hits for c in connector), tiers)
        spec = [sd for sd in (getattr(s, "spec_decoding_stats", None) for s in scheds) if sd is not None]
        if spec:  # vLLM's `SpecDecodingProm.observe` per step
            drafts, draft_tokens, accepted, per_pos = zip(*map(_SPEC, spec))
            self.dropped += add_spec_decoding(m, sum(drafts), sum(draft_tokens), sum(accepted), per_pos)
        evictions = [ev for s in scheds for ev in (getattr(s, "kv_cache_eviction_events", None) or ())]
        if evictions:  # vLLM's `KVCacheEvictionEvent`s (seconds), as its logger observes them
            fold_kv_evictions(m, np.array([ev.lifetime_seconds for ev in evictions], np.float64),
                              np.array([ev.idle_seconds for ev in evictions], np.float64),
                              np.array([g for ev in evictions for g in ev.reuse_gaps_seconds], np.float64))
        perf = [p for p in (getattr(s, "perf_stats", None) for s in scheds) if p is not None]
        if perf:  # vLLM's `PerfMetricsProm.observe` per step (it skips an all-zero step: adding 0 is the same)
            flops, read, write = zip(*map(_PERF, perf))
            for counter, values in zip(PERF_COUNTERS, (flops, read, write)):
                m.add(counter, sum(values))

    def _iterations(self, e: EngineStats, its: list) -> None:
        m, h = e.metrics, e.metrics.histograms
        split = hasattr(its[0], "prompt_token_stats")
        gen, preempted, max_gen, n_params, ttft, itl, fins, pts = zip(*map(
            _ITERATION if split else _ITERATION_BEFORE_0_16, its))
        if split:
            total, computed, local_hit, external, cached = zip(*map(_PROMPT, pts))
            by_source = m.counters["otel_llm.usage.prompt_tokens_by_source"]  # PromptTokenStats.ALL_SOURCES
            for i, vals in enumerate((computed, local_hit, external)):
                by_source[i] += sum(vals)
            m.add("otel_llm.usage.prompt_tokens_cached", sum(cached))
            if self.vllm_families and hasattr(pts[0], "recomputed_tokens"):
                e.extras.recomputed += sum(p.recomputed_tokens for p in pts)
        else:  # before vLLM 0.16: one number per step, no split by source
            total = computed = pts
        m.add("otel_llm.usage.generation_tokens", sum(gen))
        m.add("otel_llm.usage.prompt_tokens", sum(total))
        m.add("otel_llm.scheduler.preemptions", sum(preempted))
        step_prompt = computed if self.step_tokens_computed else total  # what vLLM's release observes
        h["otel_llm.step.tokens"].fold(np.add(step_prompt, gen, dtype=np.float64))
        for name, lists in (("otel_llm.request.max_generation_tokens", max_gen),
                            ("gen_ai.server.time_to_first_token", ttft)):
            vals = list(chain.from_iterable(lists))
            if vals:
                h[name].fold(np.array(vals, np.float64), OP_OTHER)
        _record_runs(h["otel_llm.request.params.n"], n_params)  # almost always all 1
        _record_runs(h["otel_llm.request.inter_token_latency"], itl)
        fins = list(chain.from_iterable(fins))
        if fins:
            _finished(e, fins)


def _record_runs(h: HistogramState, per_step: tuple[list, ...]) -> None:
    """Per-step lists whose values are mostly all equal within a step: such a step costs one comparison
    per value and adds one (value, count) pair; other steps' values go in as they are. (A step's ITLs
    are one engine timestamp minus each request's previous one: in steady decode, all the same.)"""
    same, counts, mixed = [], [], []
    for vals in per_step:
        if vals:
            n = len(vals)
            if vals.count(vals[0]) == n:
                same.append(vals[0])
                counts.append(n)
            else:
                mixed += vals
    if same:
        h.record_weighted(np.array(same, np.float64), np.array(counts, np.float64), OP_OTHER)
    if mixed:
        h.fold(np.array(mixed, np.float64), OP_OTHER)


def _finished_getter(first):
    """(`_FINISHED`, or for an older vLLM's `FinishedRequestStats` a getter that reads 0 for the fields
    it lacks, and those fields): no `num_cached_tokens` before 0.13, no `num_preemptions` before 0.30.
    Probed once per flush; what a release does not measure is not observed."""
    have = tuple(hasattr(first, f) for f in _FINISHED_FIELDS)
    found = _GETTERS.get(have)
    if found is None:
        pairs = tuple(zip(_FINISHED_FIELDS, have))
        getter = _FINISHED if all(have) else (lambda r: tuple(getattr(r, f) if ok else 0 for f, ok in pairs))
        found = _GETTERS[have] = getter, frozenset(f for f, ok in pairs if not ok)
    return found


_GETTERS: dict[tuple[bool, ...], tuple] = {}


def _finished(e: EngineStats, fins: list) -> None:
    h = e.metrics.histograms
    # Read straight into one flat array (no list of rows); an unset max_tokens_param (None) reads NaN.
    width = len(_FINISHED_FIELDS)
    getter, missing = _finished_getter(fins[0])
    a = np.fromiter(chain.from_iterable(map(getter, fins)), np.float64,
                    len(fins) * width).reshape(-1, width).T
    reason = a[_COLUMN["finish_reason"]].astype(np.int64)
    reason[(reason < 0) | (reason >= NUM_REASONS)] = FinishReason.ERROR
    by_reason = OP_OTHER * NUM_REASONS + reason
    e.metrics.add_many("otel_llm.request.finished", by_reason)
    for name, col in _PER_REQUEST:
        if _FINISHED_FIELDS[col] not in missing:
            h[name].fold(a[col], by_reason if name == "gen_ai.server.request.duration" else OP_OTHER)
    if "num_cached_tokens" not in missing:
        prompt, cached = a[_COLUMN["num_prompt_tokens"]], a[_COLUMN["num_cached_tokens"]]
        h["otel_llm.request.prefill_kv_computed_tokens"].fold(prompt - np.maximum(cached, 0), OP_OTHER)
    if e.goodput is not None:
        _judge(e, a, reason, missing)
    max_tokens = a[_COLUMN["max_tokens_param"]]
    set_mt = (max_tokens > 0) | (max_tokens < 0)  # vLLM observes it only when set (not None, not 0)
    if set_mt.any():
        h["otel_llm.request.params.max_tokens"].fold(max_tokens[set_mt], OP_OTHER)


def _judge(e: EngineStats, a: np.ndarray, reason: np.ndarray, missing: frozenset) -> None:
    """Goodput from FinishedRequestStats: e2e as vLLM's histogram has it; TTFT, which it does not carry
    per request, as e2e minus the decode time (the frontend's TTFT, short of the difference between
    its handling of the first and the last output); TPOT as vLLM's mean, for two or more tokens."""
    nan = np.full(a.shape[1], np.nan)
    e2e, decode, gen = a[_COLUMN["e2e_latency"]], a[_COLUMN["decode_time"]], a[_COLUMN["num_generation_tokens"]]
    ttft = nan if "decode_time" in missing else np.where(gen > 0, e2e - decode, np.nan)
    tpot = nan if "mean_time_per_output_token" in missing else \
        np.where(gen > 1, a[_COLUMN["mean_time_per_output_token"]], np.nan)
    e.goodput.count(e.metrics.counters[GOODPUT], np.full(a.shape[1], OP_OTHER), ttft, tpot, e2e, reason)
