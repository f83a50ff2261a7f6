"""`Collector`: the single-host default pipeline, wired from one `CollectorConfig`.

                          metrics                   +--> Prometheus scrape endpoint (/metrics)
    OTLP/HTTP receiver --+-------> MetricStore (shim) +
    scrape receiver -----+    |                     +--> remote-write exporters (one queue each)
                         |    +--> OTLP metric exporters (as received; one queue each)
    OTLP/gRPC receiver --+-------> TracePipeline -------> trace exporters (one queue each)
                          traces   (phase spans, tail sampling, trace store)

Threads: the receivers' request threads ingest into the store and hand traces to the
trace exporters' queues (or to the tail sampler, which holds a trace until its root span
arrives); a housekeeping thread, every second, decides traces that waited too long for
their root, expires silent series and
hands the series that changed to the remote-write exporters; every exporter sends from
its own queue and thread; the scrape endpoint renders under the store's lock. Traces are
taken only when there is a trace backend (`traces_to`) or a trace store (kept in SQLite by
its own writer thread, served by Jaeger's query API); otherwise /v1/traces answers 404.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from otel_llm.collector.exporter.otlp import DISK_QUEUE, OtlpExporter, OtlpExporterConfig
from otel_llm.collector.exporter.prometheus import exposition
from otel_llm.collector.exporter.prometheus.endpoint import ScrapeEndpoint
from otel_llm.collector.exporter.prometheus.metric_store import MetricStore, StoreConfig
from otel_llm.collector.exporter.remote_write.exporter import RemoteWriteConfig, RemoteWriteExporter
from otel_llm.collector.exporter.remote_write.series import RemoteWriteSeries
from otel_llm.collector.exporter.trace_store import TraceStoreWriter
from otel_llm.collector.extension.jaeger_query import JaegerQueryApi
from otel_llm.collector.extension.self_telemetry import SelfTelemetry
from otel_llm.collector.http_endpoint import HttpServerSettings
from otel_llm.collector.processor.tail_sampling import TailSamplingConfig
from otel_llm.collector.receiver.otlp_grpc import OtlpGrpcReceiver, OtlpGrpcReceiverConfig
from otel_llm.collector.receiver.otlp_http import OtlpReceiver, OtlpReceiverConfig, PartialSuccess, Signal
from otel_llm.collector.receiver.scrape import ScrapeReceiver, ScrapeTarget
from otel_llm.collector.trace_pipeline import TracePipeline
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
from otel_llm.export.redaction import redact_url

logger = logging.getLogger("otel_llm.collector")


@dataclass(frozen=True)
class CollectorConfig:
    """Ports 0 pick free ones (read them back from the started `Collector`); None turns a part off."""

    host: str = "127.0.0.1"
    otlp_http_port: int | None = 4318
    otlp_grpc_port: int | None = 4317
    prometheus_port: int | None = 9464
    store: StoreConfig = StoreConfig()
    max_body_bytes: int = 16 * 1024 * 1024
    housekeeping_interval_s: float = 1.0  # expiry, and remote-write pushes of what changed
    remote_write_urls: tuple[str, ...] = ()
    metrics_to: tuple[str, ...] = ()  # OTLP metric backends: the metrics as received (and scraped), canonical
    traces_to: tuple[str, ...] = ()  # trace backends: http(s)://host:port[/path] or grpc://host:port
    storage_dir: str | None = None  # trace backends' queues on disk there (SQLite), else in memory
    tail_sampling: TailSamplingConfig | None = None  # None: every span goes to every backend
    trace_store: TraceStoreConfig | None = None  # keep traces in SQLite, served by Jaeger's query API
    jaeger_port: int = 16686  # the query API's port, with trace_store (0 = any free port)
    phase_spans: bool = True  # derive queue/prefill/decode spans for vLLM's latency-only request spans
    scrape_targets: tuple[ScrapeTarget, ...] = ()  # Prometheus /metrics pulled into the store
    http_server: HttpServerSettings = HttpServerSettings()  # every HTTP listener's connections and deadlines,
    # and every listener's TLS and credentials (the gRPC receiver's too)

    def remote_write_configs(self) -> list[RemoteWriteConfig]:
        return [RemoteWriteConfig(url, name=f"prometheusremotewrite/{i}") for i, url in enumerate(self.remote_write_urls)]

    def metric_exporter_configs(self) -> list[OtlpExporterConfig]:
        return [OtlpExporterConfig(url, name=f"{'otlp' if url.startswith('grpc://') else 'otlphttp'}/metrics/{i}",
                                   signal="metrics", max_batch=4096)
                for i, url in enumerate(self.metrics_to)]

    def trace_exporter_configs(self) -> list[OtlpExporterConfig]:
        queue = {} if self.storage_dir is None else {"queue": DISK_QUEUE}
        return [OtlpExporterConfig(url, name=f"{'otlp' if url.startswith('grpc://') else 'otlphttp'}/{i}",
                                    storage_dir=self.storage_dir, **queue)
                for i, url in enumerate(self.traces_to)]

    def __post_init__(self) -> None:
        self.remote_write_configs()  # a bad URL fails here, named
        self.trace_exporter_configs()
        self.metric_exporter_configs()
        for name in ("otlp_http_port", "otlp_grpc_port", "prometheus_port", "jaeger_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {port!r}")
        if self.otlp_http_port is None and self.otlp_grpc_port is None:
            raise ValueError("at least one OTLP receiver (HTTP or gRPC) must be on")
        if not self.housekeeping_interval_s > 0:
            raise ValueError(f"housekeeping_interval_s must be > 0, got {self.housekeeping_interval_s!r}")


class Collector:
    def __init__(self, config: CollectorConfig | None = None):
        self.config = config = config or CollectorConfig()
        self.store = MetricStore(config.store)
        self.trace_store = None if config.trace_store is None else TraceStore(config.trace_store)
        self.jaeger = None if self.trace_store is None else JaegerQueryApi(self.trace_store, config.host,
                                                                           config.jaeger_port, config.http_server)
        writers = [] if self.trace_store is None else [TraceStoreWriter(self.trace_store)]
        self.traces = TracePipeline([*(OtlpExporter(c) for c in config.trace_exporter_configs()), *writers],
                                    config.tail_sampling, config.phase_spans)
        data_types = ("metrics", "traces") if self.traces.exporters else ("metrics",)
        signals = frozenset(Signal(d) for d in data_types)
        self.telemetry = SelfTelemetry(self.store.num_series, data_types)
        self.http = None if config.otlp_http_port is None else OtlpReceiver(
            self._sink("http"), OtlpReceiverConfig(config.host, config.otlp_http_port, config.max_body_bytes,
                                                   signals=signals, server=config.http_server))
        self.grpc = None if config.otlp_grpc_port is None else OtlpGrpcReceiver(
            self._sink("grpc"), OtlpGrpcReceiverConfig(config.host, config.otlp_grpc_port, config.max_body_bytes,
                                                       signals=signals, server=config.http_server))
        self.scrape = None if config.prometheus_port is None else ScrapeEndpoint(
            self.render, config.host, config.prometheus_port, self.store.router.profile.openmetrics,
            config.http_server)
        self.scrapers = ScrapeReceiver(config.scrape_targets, self.store,
                                       lambda payload: self.ingest_metrics(payload, "http", "prometheus"))
        self.remote_writers = [RemoteWriteExporter(c) for c in config.remote_write_configs()]
        self.metric_exporters = [OtlpExporter(c) for c in config.metric_exporter_configs()]
        self.exporters = (*self.remote_writers, *self.metric_exporters, *self.traces.exporters)
        for exporter in self.exporters:
            self.telemetry.add_exporter(exporter)
        for name, part in (("otlp_http", self.http and self.http.server), ("prometheus", self.scrape),
                           ("jaeger_query", self.jaeger)):
            if part is not None:
                self.telemetry.add_listener(name, part)
        self._remote_write_series = RemoteWriteSeries()
        self._stop = threading.Event()
        self._housekeeper: threading.Thread | None = None

    def _sink(self, transport: str):
        def sink(signal: Signal, payload: bytes) -> PartialSuccess | None:
            if signal is Signal.TRACES:
                result, records = self.traces.consume(payload), "spans"
                self.telemetry.count(transport, result.accepted, result.refused, "traces")
            else:
                result, records = self.ingest_metrics(payload, transport), "metric points"
            if result.refused:
                logger.warning("refused %d of %d %s over %s: %s", result.refused,
                               result.accepted + result.refused, records, transport, result.reason)
                return PartialSuccess(result.refused, result.reason)
            return None

        return sink

    def ingest_metrics(self, payload: bytes, transport: str, receiver: str = "otlp"):
        """One ExportMetricsServiceRequest into the store (raises PayloadError if malformed), counted, and
        as it came to every OTLP metric backend."""
        result = self.store.ingest(payload)
        self.telemetry.count(transport, result.accepted, result.refused, receiver=receiver)
        for exporter in self.metric_exporters:
            exporter.export(payload, result.accepted + result.refused)
        return result

    def render(self, openmetrics: bool = False) -> bytes:
        own = (*self.telemetry.families(), *self.traces.families(), *self.scrapers.families())
        with self.store.lock:
            return exposition.render(self.store, openmetrics, own)

    def start(self) -> Collector:
        for exporter in self.exporters:
            exporter.start()
        for part in (self.http, self.grpc, self.scrape, self.jaeger, self.scrapers):
            if part is not None:
                part.start()
        self._housekeeper = threading.Thread(target=self._housekeeping, name="collector-housekeeping", daemon=True)
        self._housekeeper.start()
        return self

    def _housekeeping(self) -> None:
        while not self._stop.wait(self.config.housekeeping_interval_s):
            try:
                self.traces.tick()
                if self.trace_store is not None:
                    self.trace_store.enforce_retention()
                self.store.expire()
                self.push_remote_write()
            except Exception:  # housekeeping must keep running
                logger.exception("collector housekeeping failed")

    def push_remote_write(self) -> None:
        """Hand what changed since the last push to every remote-write exporter (never blocks on them)."""
        if not self.remote_writers:
            return
        with self.store.lock:
            series = self._remote_write_series.collect(self.store)
        if series:
            for exporter in self.remote_writers:
                exporter.export(series)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop receiving, push what is left, give the exporters `timeout_s` in all to deliver it."""
        self._stop.set()
        for part in (self.http, self.grpc, self.scrape, self.jaeger, self.scrapers):
            if part is not None:
                part.stop()
        if self._housekeeper is not None:
            self._housekeeper.join()
            self._housekeeper = None
            self.push_remote_write()
            self.traces.flush()  # waiting traces are decided with what they have
        deadline = time.monotonic() + timeout_s
        for exporter in self.exporters:
            exporter.stop(max(0.0, deadline - time.monotonic()))
        if self.trace_store is not None:
            self.trace_store.close()

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def describe(self) -> str:
        """Where it listens, for the startup log line."""
        parts = []
        if self.http is not None:
            parts.append(f"OTLP/HTTP {self.http.endpoint}/v1/metrics")
        if self.grpc is not None:
            parts.append(f"OTLP/gRPC {self.grpc.endpoint}")
        if self.scrape is not None:
            parts.append(f"Prometheus {self.scrape.url} ({self.store.config.profile} names)")
        parts.extend(f"scraping {t.shown_url} every {t.interval_s:g}s (job {t.job})" for t in self.config.scrape_targets)
        parts.extend(f"remote-write {redact_url(url)}" for url in self.config.remote_write_urls)
        parts.extend(f"metrics to {redact_url(e.config.endpoint)}" for e in self.metric_exporters)
        parts.extend(f"traces to {redact_url(e.config.url)}" for e in self.traces.exporters if isinstance(e, OtlpExporter))
        if self.jaeger is not None:
            parts.append(f"Jaeger query API {self.jaeger.url} (traces in {self.trace_store.path})")
        settings = self.config.http_server
        if settings.tls is not None:
            parts.append("TLS" + (" with client certificates" if settings.tls.client_ca_file else ""))
        if settings.auth is not None:
            parts.append(settings.auth.describe())
        return ", ".join(parts)
