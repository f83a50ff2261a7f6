"""otel-llm inside vLLM: the stat-logger plugin `vllm serve` loads by entry point.

Installing otel-llm into vLLM's environment registers `StatLogger` under the
entry-point group `vllm.stat_logger_plugins`; vLLM constructs it in every
API-server process and calls `record(...)` once per engine step on that
process's event loop. The only module of otel_llm that imports vLLM.

Configuration is by environment only (vLLM has no flags for plugins); a bad
value stops vLLM at start-up with a message naming the variable:

- `OTEL_LLM_VLLM_METRICS`: `add` (default): vLLM's own Prometheus logger stays
  and ours pushes OTLP alongside; `replace`: ours subclasses vLLM's
  `PrometheusStatLogger`, so vLLM installs no second one, and serves every
  `vllm:*` family vLLM would (vLLM's own `__init__` declares them on
  otel_llm's `prom_families` classes) from otel_llm's vectorised aggregation.
- `OTEL_METRICS_EXPORTER`: `otlp` (default) or `none`; `OTEL_EXPORTER_OTLP_*`
  (endpoint, protocol grpc or http/protobuf, headers, timeout),
  `OTEL_METRIC_EXPORT_INTERVAL` (ms, default 60000),
  `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE` (cumulative, delta,
  lowmemory), `OTEL_SERVICE_NAME` (default `vllm`), `OTEL_RESOURCE_ATTRIBUTES`.
- `OTEL_LLM_VLLM_LANE`: `auto` (default): when vLLM traces (`--otlp-traces-endpoint`), its engine
  steps go out as the engine lane's window spans through vLLM's own tracer (`otel_llm.vllm.lane`);
  `off`: no lane.
- `OTEL_LLM_SLO_CONFIG`: an SLO file (`otel_llm.slo.config`); each finished
  request is judged against its objectives and counted in
  `otel_llm.slo.requests` (pushed; in `replace` mode also served as
  `otel_llm_slo_requests_total{model_name, engine, missed}`).

Every point carries the model name and engine index; the resource carries a
`service.instance.id` unique to the process and `vllm.api_server.rank`. With
`--api-server-count N` each API-server process pushes what it saw (the
requests it served; the scheduler counters of the steps whose stats vLLM
sent it): a collector's sums are exact. vLLM sends each step's
`SchedulerStats` to one API server only, so the scheduler gauges (running,
waiting, KV-cache usage) are exported by rank 0 alone.

`record` never raises into vLLM (an exception there kills vLLM's output
handler): failures are logged once and counted (`otel_llm.telemetry.dropped`).

Size: the faces vLLM loads (the OTLP stat logger, the Prometheus one that serves vLLM's families,
the fast /metrics hook) share one construction from vLLM's config; the folding itself is `stats`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from operator import attrgetter

from vllm.v1.metrics.loggers import AggregateStatLoggerBase, PrometheusStatLogger

from otel_llm.canonical.instruments import SLO_MISSED, Kind, instrument_table
from otel_llm.export.exposition import series_groups
from otel_llm.export.metric_producer import TEMPORALITIES, attach_reader
from otel_llm.export.otlp_endpoint import otlp_destination
from otel_llm.export.otlp_metrics import export_interval_s
from otel_llm.export.prom_families import FamilySet, shim_classes
from otel_llm.shim.profiles import get_profile, goodput_family
from otel_llm.slo.config import SloConfig, SloConfigError, load_slo_config
from otel_llm.vllm.compat import (ALIASES, STEP_TOKENS_COMPUTED_FROM, helper_classes, parse_version, serving_note,
                                  vllm_filled, vllm_version)
from otel_llm.vllm.lane import VllmLane, vllm_tracer
from otel_llm.vllm.stats import VllmStatsAggregator

logger = logging.getLogger("vllm.otel_llm")  # under vLLM's configured "vllm" logger

MODE_VAR = "OTEL_LLM_VLLM_METRICS"
SLO_VAR = "OTEL_LLM_SLO_CONFIG"
LANE_VAR = "OTEL_LLM_VLLM_LANE"
MODES = ("add", "replace")
_SHUTDOWN_S = 3.0  # the most vLLM's exit waits for a last OTLP export


def _env_choice(var: str, choices: tuple[str, ...], default: str) -> str:
    value = os.environ.get(var, "").strip().lower() or default
    if value not in choices:
        raise ValueError(f"otel-llm: {var}={os.environ[var]!r} is not one of {', '.join(choices)}")
    return value


def _env_positive_number(var: str) -> None:
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return
    try:
        ok = float(raw) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"otel-llm: {var}={raw!r} must be a positive number of milliseconds")


def _env_slo() -> SloConfig | None:
    path = os.environ.get(SLO_VAR, "").strip()
    if not path:
        return None
    try:
        return load_slo_config(path)
    except SloConfigError as exc:
        raise ValueError(f"otel-llm: {SLO_VAR}: {exc}") from None


class _OtelSide:
    """What both modes share: the aggregator and the OTLP push of one API-server process."""

    def __init__(self, vllm_config, engine_indexes, extra_buckets=None, vllm_families=False, slo=None):
        """`vllm_families`: also aggregate what only vLLM's own families show (we serve them);
        `slo`: the SLO objectives (`OTEL_LLM_SLO_CONFIG`), read by the caller."""
        self.mode = _env_choice(MODE_VAR, MODES, "add")
        exporter = _env_choice("OTEL_METRICS_EXPORTER", ("otlp", "none"), "otlp")
        temporality = _env_choice("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", TEMPORALITIES, "cumulative")
        _env_choice("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", ("grpc", "http/protobuf"),
                    _env_choice("OTEL_EXPORTER_OTLP_PROTOCOL", ("grpc", "http/protobuf"), "http/protobuf"))
        for var in ("OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT"):
            _env_positive_number(var)
        self.vllm_config = vllm_config
        model = vllm_config.model_config
        parallel = vllm_config.parallel_config
        observability = getattr(vllm_config, "observability_config", None)
        self.rank = getattr(parallel, "_api_process_rank", 0)
        self.api_servers = getattr(parallel, "_api_process_count", 1)
        self.agg = VllmStatsAggregator(str(model.served_model_name), model.max_model_len, engine_indexes or [0],
                                       extra_buckets=extra_buckets, scheduler_gauges=self.rank <= 0,
                                       vllm_families=vllm_families,
                                       kv_cache_metrics=bool(getattr(observability, "kv_cache_metrics", False)),
                                       mfu_metrics=hasattr(PrometheusStatLogger, "_perf_metrics_cls"),
                                       step_tokens_computed=parse_version(vllm_version()) >= STEP_TOKENS_COMPUTED_FROM,
                                       slo=slo)
        self.reader = None
        if exporter == "otlp":
            self._start_push(temporality)
        self.lane_on = _env_choice(LANE_VAR, ("auto", "off"), "auto") == "auto"
        self._start_lane()

    def _start_lane(self) -> None:
        """The engine lane, once vLLM's tracer provider is set (it is before vLLM builds its loggers)."""
        if self.lane_on and self.agg.lane is None:
            tracer = vllm_tracer()
            if tracer is not None:
                self.agg.lane = VllmLane(str(self.vllm_config.model_config.served_model_name), tracer)

    def _start_push(self, temporality: str) -> None:
        from opentelemetry.sdk.resources import Resource

        from otel_llm.export.otlp_metrics import otlp_metric_reader, service_resource

        resource = service_resource("vllm").merge(Resource({"vllm.api_server.rank": self.rank}))
        self.instance_id = resource.attributes["service.instance.id"]
        self.reader = otlp_metric_reader(None)
        attach_reader(self.reader, self.agg.engines.values(), resource, temporality)
        self.temporality = temporality
        atexit.register(self.shutdown)

    def engine_initialized(self) -> None:
        """The cache configuration, complete now (vLLM's `log_engine_initialized`), on the pushed
        `otel_llm.cache_config.info` points. Never raises."""
        try:
            self.agg.cache_config(self.vllm_config.cache_config.metrics_info())
            self._start_lane()
        except Exception:
            self.agg._failed("log_engine_initialized")

    def started(self) -> str:
        where = ("OTLP push off (OTEL_METRICS_EXPORTER=none)" if self.reader is None else
                 f"OTLP push ({self.temporality}, every {export_interval_s():g} s) to "
                 f"{otlp_destination('metrics')} as service.instance.id={self.instance_id}")
        lane = "engine lane: through vLLM's tracer" if self.agg.lane is not None else \
            "engine lane: off" + ("" if not self.lane_on else " (vLLM is not tracing)")
        return (f"otel-llm stat logger ({self.mode} mode, API server {self.rank} of {self.api_servers}): "
                f"{where}; {lane}")

    def shutdown(self) -> None:
        """Flush and stop the push, waiting at most _SHUTDOWN_S (a down or hung endpoint never holds vLLM)."""
        reader, self.reader = self.reader, None
        if reader is None:
            return
        self.agg.flush()
        t = threading.Thread(target=reader.shutdown, kwargs={"timeout_millis": _SHUTDOWN_S * 1000},
                             name="otel-llm-shutdown", daemon=True)
        t.start()
        t.join(_SHUTDOWN_S)


class OtelLLMStatLogger(AggregateStatLoggerBase):
    """`add` mode: vLLM keeps its Prometheus logger; this one pushes OTLP alongside."""

    def __init__(self, vllm_config, engine_indexes=None):
        _note_version()
        self._otel = _OtelSide(vllm_config, engine_indexes, slo=_env_slo())
        self.record = self._otel.agg.record  # the event-loop path: one deque append per step

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        self._otel.agg.record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)

    def log(self):  # every 10 s: fold queued steps off the token path
        self._otel.agg.flush()

    def log_engine_initialized(self):
        self._otel.engine_initialized()
        logger.info("%s", self._otel.started())

    def record_admission_rejection(self, reason: str) -> None:
        self._otel.agg.reject(reason)  # pushed; vLLM's own logger serves vllm:admission_rejections

    def record_sleep_state(self, sleep: int = 0, level: int = 0):
        self._otel.agg.sleep(sleep, level)  # pushed; vLLM's own logger serves vllm:engine_sleep_state


class OtelLLMPrometheusStatLogger(PrometheusStatLogger):
    """`replace` mode: vLLM's `vllm:*` families, values from otel_llm's aggregation, plus the OTLP push.

    Families this vLLM declares that otel_llm has no values for (a release newer than the checked
    range may add one) get theirs from vLLM's own `record` on the declared classes, step by step in
    `flush` (`vllm_records`, named in one WARNING); if vLLM's constructor fails on the declared classes,
    vLLM's own logger serves its families as in `add` mode (one WARNING), and OTLP is pushed alongside."""

    def __init__(self, vllm_config, engine_indexes=None):
        _note_version()
        slo = _env_slo()
        self.families = FamilySet()
        self.multiprocess = "PROMETHEUS_MULTIPROC_DIR" in os.environ  # --api-server-count > 1
        self.serving, self.vllm_records = not self.multiprocess, False
        if self.serving:
            try:
                self._declare_on_shims()
                super().__init__(vllm_config, engine_indexes)
            except Exception as exc:
                _off("serving vLLM's families from otel-llm's aggregation (replace mode); vLLM's own logger "
                     "serves them and otel-llm pushes OTLP alongside", exc)
                for attr in [a for a in vars(self) if a.endswith("_cls")]:
                    delattr(self, attr)
                self.serving, self.families = False, FamilySet()
        if not self.serving:
            super().__init__(vllm_config, engine_indexes)
        buckets = self._custom_buckets() if self.serving else {}
        self._otel = _OtelSide(vllm_config, self.engine_indexes, buckets, vllm_families=self.serving, slo=slo)
        if self.multiprocess:
            logger.warning("otel-llm: %s=replace needs one API server; with several, vLLM's multiprocess "
                           "Prometheus path is kept and otel-llm pushes OTLP alongside", MODE_VAR)
        if not self.serving:
            return
        self._optional_stats = _optional_stats_getter()
        self._otel.agg.on_steps = self._vllm_steps
        if slo is not None:
            self._declare_goodput(str(vllm_config.model_config.served_model_name))
        self._install_sources()
        install_fast_metrics(self)
        self.record = self._otel.agg.record

    def _declare_on_shims(self) -> None:
        shims = dict(zip(("_counter_cls", "_gauge_cls", "_histogram_cls"), shim_classes(self.families)))
        for attr, shim in shims.items():
            setattr(self, attr, shim)
        for attr, cls in helper_classes(PrometheusStatLogger).items():  # spec decode, KV/EC connectors, MFU
            setattr(self, attr, type(cls.__name__, (cls,), {a: s for a, s in shims.items() if hasattr(cls, a)}))

    def _declare_goodput(self, model: str) -> None:
        """`otel_llm_slo_requests_total` beside vLLM's families, its children pre-created as vLLM's are."""
        fam = goodput_family("vllm")
        counter = self._counter_cls(name=fam.name, documentation=instrument_table(8)[fam.canonical].description,
                                    labelnames=["model_name", "engine", "missed"])
        for idx in self.engine_indexes:
            for missed in SLO_MISSED:
                counter.labels(model, str(idx), missed)

    # -- vLLM's interface ---------------------------------------------------------------------

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        if not self.serving:
            super().record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)
        self._otel.agg.record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)

    def log(self):
        self._otel.agg.flush()

    def log_engine_initialized(self):
        try:
            super().log_engine_initialized()  # vllm:cache_config_info, declared on the shims
        except Exception:
            logger.exception("otel-llm: cache_config_info not declared")
        self._otel.engine_initialized()
        logger.info("%s", self._otel.started())

    def record_admission_rejection(self, reason: str) -> None:
        try:
            super().record_admission_rejection(reason)  # vLLM's own (its KeyError on an unknown reason is counted)
            self._otel.agg.reject(reason)  # the value served and pushed
        except Exception:
            self._otel.agg._failed("record_admission_rejection")

    def record_sleep_state(self, sleep: int = 0, level: int = 0):
        try:
            super().record_sleep_state(sleep, level)  # vLLM's own, on the shims
        except Exception:
            self._otel.agg._failed("record_sleep_state")
        if hasattr(self, "_otel"):  # (vLLM's own __init__ calls this before ours has built it: awake, as ours starts)
            self._otel.agg.sleep(sleep, level)  # pushed

    # -- the families' values -----------------------------------------------------------------

    def _custom_buckets(self) -> dict[str, tuple[float, ...]]:
        """Canonical histogram -> the boundaries vLLM declared for its family (custom buckets included)."""
        out = {}
        for fam in get_profile("vllm").families:
            declared = self.families.families.get(fam.name)
            if declared is not None and declared.buckets:
                out[fam.canonical] = declared.buckets
        return out

    def _install_sources(self) -> None:
        """Each declared family's values from the aggregation; those it has none for, from vLLM's code."""
        agg, fams = self._otel.agg, self.families.families
        for pfam in get_profile("vllm", goodput=agg.slo is not None).families:
            fam = fams.get(pfam.name)
            inst = agg.table.get(pfam.canonical)
            if fam is None or inst is None or pfam.canonical == "otel_llm.cache_config.info":
                continue
            fam.source = _canonical_source(fam, pfam, inst, agg)
        extras = {
            "vllm:prompt_tokens_recomputed": lambda x, lab: x.recomputed,
        }
        for name, get in extras.items():
            fam = fams.get(name)
            if fam is not None:
                fam.source = _extras_source(fam, agg, get)
        for old, same in ALIASES.items():
            if old in fams and same in fams and fams[same].source is not None:
                fams[old].source = fams[same].source
        unsourced = [n for n, f in fams.items() if f.source is None and not vllm_filled(n)]
        if unsourced:
            self.vllm_records = True
            logger.warning("otel-llm: vLLM %s declares %s, which otel-llm does not aggregate: vLLM's own code "
                           "records every step for them (replace mode's cost is then vLLM's)", vllm_version(),
                           ", ".join(unsourced))

    def render(self) -> bytes:
        """This logger's `vllm:*` families in text format 0.0.4 (prometheus_client's bytes)."""
        with self._otel.agg.settled():
            return self.families.render()

    def describe(self):  # registers no names: vLLM re-creating its logger never collides with this one
        return []

    def collect(self):
        """prometheus_client Collector protocol (the OpenMetrics route `/metrics/`, other registries)."""
        with self._otel.agg.settled():
            return list(self.families.collect())

    def _vllm_steps(self, engine_idx: int, steps: list) -> None:
        """Per step, what only some configurations have (spec decode, KV/EC connectors, MFU, KV-block
        residency, LoRA, KV fetch stages, NaN and watermark counts): vLLM's own code, on the shims.
        Every step, when this vLLM declares families otel-llm has no values for (`vllm_records`)."""
        if self.vllm_records:
            for _, sched, it, mm in steps:
                PrometheusStatLogger.record(self, sched, it, mm, engine_idx)
            return
        always = bool(getattr(self, "gauge_kv_fetch_by_stage", None)) or self.gauge_lora_info is not None \
            or getattr(self, "kv_cache_metrics_enabled", False)
        corrupted = getattr(self, "counter_corrupted_requests", None)  # declared only with those options
        watermark = getattr(self, "counter_watermark_requests", None)
        optional, nothing = self._optional_stats
        for _, sched, it, _ in steps:
            if sched is not None and (always or optional(sched) != nothing):
                PrometheusStatLogger.record(self, sched, None, None, engine_idx)
            if it is not None:
                if corrupted is not None:
                    corrupted[engine_idx].inc(it.num_corrupted_reqs)
                if watermark is not None:  # vLLM 0.32 on
                    for label, field in _WATERMARK:
                        watermark[label][engine_idx].inc(getattr(it, field, 0))


_WATERMARK = (("watermarked", "num_watermarked_reqs"), ("skipped", "num_watermark_skipped_reqs"),
              ("not_watermarked", "num_not_watermarked_reqs"))
# SchedulerStats fields of optional features (each newer in some releases: only those it has are read)
_OPTIONAL_STATS = ("spec_decoding_stats", "kv_connector_stats", "ec_connector_stats", "perf_stats")


def _optional_stats_getter() -> tuple:
    """(a getter of the optional-feature fields this vLLM's SchedulerStats has, what it returns when none is set)."""
    from vllm.v1.metrics.stats import SchedulerStats

    fields = [f for f in _OPTIONAL_STATS if hasattr(SchedulerStats, f) or
              f in getattr(SchedulerStats, "__dataclass_fields__", ())]
    if len(fields) > 1:  # every release: spec decoding and KV connector stats at least
        return attrgetter(*fields), (None,) * len(fields)
    one = attrgetter(*fields) if fields else (lambda s: None)
    return (lambda s: (one(s),)), (None,)


def _note_version() -> None:
    """The one WARNING for a vLLM release outside the checked range (once per process)."""
    global _noted
    if not _noted:
        _noted = True
        note = serving_note(vllm_version())
        if note:
            logger.warning("%s", note)


_noted = False


def _off(what: str, exc: BaseException) -> None:
    logger.warning("otel-llm: on vLLM %s, %s (%s: %s)", vllm_version(), what, type(exc).__name__, exc)


def _engine_of(fam, agg):
    """child -> the engine state its `engine` label names (None before that engine's first step);
    engine 0 for a family without the label."""
    engines = agg.engines  # one dict for the aggregator's life
    if "engine" not in fam.labelnames:
        return lambda child: engines.get(0)
    at = fam.labelnames.index("engine")
    return lambda child: engines.get(int(child.labelvalues[at]))


def _canonical_source(fam, pfam, inst, agg):
    """A family's values from a canonical instrument's per-engine state (re-bucketed exactly).
    `pfam`: the `vllm` profile's entry, which says which dims are labels (as on our own /metrics)."""
    import numpy as np

    engine = _engine_of(fam, agg)
    groups = dict(series_groups(inst, pfam))  # label pairs -> the series they sum
    labels = [pfam.labels[d][0] for d in inst.dims if d in pfam.labels]
    chosen: dict[tuple[str, ...], int | np.ndarray] = {}

    def series(child) -> int | np.ndarray:
        """The instrument's series this child shows (summed when the family drops a dimension)."""
        s = chosen.get(child.labelvalues)
        if s is None:
            lab = fam.label_dict(child)
            s = groups.get(tuple((name, lab.get(name, "")) for name in labels), np.zeros(0, np.int64))
            s = chosen[child.labelvalues] = int(s[0]) if len(s) == 1 else s
        return s

    if inst.kind is Kind.HISTOGRAM:
        fine = np.asarray(inst.buckets, np.float64)
        pos = np.append(np.searchsorted(fine, np.asarray(fam.buckets, np.float64)), len(fine))

        def hist(child):
            e = engine(child)
            if e is None:
                return [0] * len(pos), 0.0
            h, s = e.metrics.histograms[inst.name], series(child)
            if type(s) is int:  # one series: no sum over series (numpy's reductions cost microseconds each)
                return h.counts[s].cumsum()[pos].tolist(), float(h.sums[s])
            return h.counts[s].sum(axis=0).cumsum()[pos].tolist(), float(h.sums[s].sum())
        return hist
    if inst.kind is Kind.COUNTER:
        def counter(child):
            e = engine(child)
            if e is None:
                return 0.0
            s = series(child)
            return float(e.metrics.counters[inst.name][s] if type(s) is int else e.metrics.counters[inst.name][s].sum())
        return counter

    def gauge(child):
        e = engine(child)
        v = None if e is None else e.metrics.gauges.get(inst.name)
        if v is None or not inst.dims:
            return 0.0 if v is None else float(v)
        s = series(child)
        return float(v[s] if type(s) is int else v[s].sum())
    return gauge


def _extras_source(fam, agg, get):
    engine = _engine_of(fam, agg)

    def value(child):
        e = engine(child)
        return 0.0 if e is None else float(get(e.extras, fam.label_dict(child)))
    return value



def install_fast_metrics(stat_logger: OtelLLMPrometheusStatLogger) -> None:
    """Serve `stat_logger`'s families on vLLM's `/metrics` from its own renderer.

    vLLM's `/metrics` handler (prometheus-fastapi-instrumentator) calls
    `generate_latest(REGISTRY)`. The logger is registered with REGISTRY as a
    collector (so every other reader sees it); the handler's `generate_latest`
    is wrapped so that REGISTRY renders as everything else through
    prometheus_client plus this logger's cached-prefix render.
    """
    from prometheus_client import REGISTRY, exposition

    REGISTRY.register(stat_logger)
    try:
        from prometheus_fastapi_instrumentator import instrumentation
    except ImportError:
        return
    original = exposition.generate_latest

    class Others:
        def collect(self):
            for collector in list(getattr(REGISTRY, "_collector_to_names", {})):
                if collector is not stat_logger:
                    yield from collector.collect()

    def generate_latest(registry=REGISTRY, *args, **kwargs):
        if registry is REGISTRY and not args and not kwargs and hasattr(REGISTRY, "_collector_to_names"):
            return original(Others()) + stat_logger.render()
        return original(registry, *args, **kwargs)

    instrumentation.generate_latest = generate_latest


# The class vLLM loads: chosen by OTEL_LLM_VLLM_METRICS when the entry point is imported (a bad
# value is reported by the constructor, so vLLM stops at start-up naming the variable).
StatLogger = OtelLLMPrometheusStatLogger if os.environ.get(MODE_VAR, "").strip().lower() == "replace" \
    else OtelLLMStatLogger
