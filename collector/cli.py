"""`otel-llm collector`: flags -> one `CollectorConfig`, then run until SIGINT/SIGTERM.

The one edge where the collector's flags are read; a bad value fails here with
exit code 2, naming the flag.

Size: every flag of the command, with its help, and the checks across flags, at the one edge
(STYLE: one validated config, built where the flags are read).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import signal
import sqlite3
import sys
import threading

from otel_llm.cli.arg_types import port, positive_int
from otel_llm.shim.profiles import PROFILE_NAMES

logger = logging.getLogger("otel_llm.collector")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def duration_s(text: str) -> float:
    """``"5m"``, ``"300s"``, ``"1.5h"``, ``"250ms"`` or plain seconds -> seconds (> 0)."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 300, 300s, 5m, 1h")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def _checked_by(config: str, what: str, example: str):
    """An argparse type: the text, once ``config`` ("module:Class", imported when used) accepts it."""
    def parse(text: str) -> str:
        module, cls = config.split(":")
        try:
            getattr(importlib.import_module(module), cls)(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: use {example}") from None
        return text

    parse.__name__ = what
    return parse


_remote_write_url = _checked_by("otel_llm.collector.exporter.remote_write.exporter:RemoteWriteConfig", "URL",
                                "e.g. http://127.0.0.1:9090/api/v1/write")
_trace_backend = _checked_by("otel_llm.collector.exporter.otlp:OtlpExporterConfig", "trace backend",
                             "http://host:4318/v1/traces or grpc://host:4317")
_metric_backend = _checked_by("otel_llm.collector.exporter.otlp:OtlpExporterConfig", "OTLP metric backend",
                              "http://host:4318/v1/metrics or grpc://host:4317")


def _threshold(text: str) -> float | None:
    return None if text.strip().lower() == "off" else duration_s(text)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"invalid fraction {text!r}: must be in [0, 1]")
    return value


duration_s.__name__ = "duration"
_threshold.__name__, _fraction.__name__ = "duration or off", "fraction"


def add_parsers(sub) -> None:
    p = sub.add_parser("collector", help="receive OTLP metrics and traces from many servers; Prometheus and trace "
                                         "backends out",
                       description="OTLP metrics and traces in (HTTP and gRPC). Metrics -> the metric-name shim -> a "
                                   "Prometheus scrape endpoint and remote-write. Traces -> OTLP trace backends "
                                   "(--traces-to), optionally tail-sampled, and/or a trace store on this host with "
                                   "Jaeger's query API (--trace-store). No config file needed.")
    p.add_argument("--host", default=None,
                   help="address every listener binds: 127.0.0.1 by default, 0.0.0.0 for all "
                        "(in --print-otelcol-config: 0.0.0.0 by default, as in a container)")
    p.set_defaults(run=run, extras=("collector",))
    p.add_argument("--otlp-http-port", type=port, default=4318,
                   help="the OTLP/HTTP receiver's port: POST /v1/metrics and /v1/traces (default 4318; 0: any "
                        "free port)")
    p.add_argument("--otlp-grpc-port", type=port, default=4317,
                   help="the OTLP/gRPC receiver's port (default 4317; 0: any free port)")
    p.add_argument("--prometheus-port", type=port, default=9464, help="serves /metrics (default 9464)")
    p.add_argument("--metrics-compat", choices=PROFILE_NAMES, default="vllm",
                   help="names on /metrics, as on a server's own /metrics?compat=NAME: vLLM's (default), OTel "
                        "semconv, SGLang's, TGI's or Triton's")
    p.add_argument("--metric-expiry", type=duration_s, default=300.0,
                   help="drop a series not updated for this long (default 5m)")
    p.add_argument("--cardinality-limit", type=positive_int, default=2000,
                   help="series per metric and sender before the rest go into an otel_metric_overflow series "
                        "(default 2000)")
    p.add_argument("--max-series", type=positive_int, default=200_000, help="series held in all (default 200000)")
    p.add_argument("--remote-write-url", action="append", default=[], metavar="URL", type=_remote_write_url,
                   help="also push to this Prometheus remote-write 1.0 endpoint, e.g. "
                        "http://127.0.0.1:9090/api/v1/write (repeatable)")
    p.add_argument("--metrics-to", action="append", default=[], metavar="URL", type=_metric_backend,
                   help="also forward the metrics (as received over OTLP, and what --scrape-target reads, under "
                        "canonical names) to this OTLP backend: http(s)://host:port[/v1/metrics] (OTLP/HTTP protobuf) "
                        "or grpc://host:port; repeatable, each with its own queue and retries")
    p.add_argument("--traces-to", action="append", default=[], metavar="URL", type=_trace_backend,
                   help="forward the spans servers send to this OTLP backend: http(s)://host:port[/v1/traces] "
                        "(OTLP/HTTP protobuf) or grpc://host:port (OTLP/gRPC); repeatable, each with its own "
                        "queue and retries. Without it, traces are not taken (/v1/traces answers 404)")
    p.add_argument("--storage-dir", metavar="DIR",
                   help="keep each trace backend's queue in a SQLite file here (up to 4 GiB each): spans the "
                        "collector acknowledged reach their backends after a crash or restart")
    p.add_argument("--no-phase-spans", dest="phase_spans", action="store_false",
                   help="pass vLLM's llm_request spans on as they come: by default each gets derived queue, "
                        "prefill and decode child spans and a first_token event from its gen_ai.latency.* "
                        "attributes (marked otel_llm.derived; the originals unchanged)")
    limits = p.add_argument_group("connections to every listener (OTLP/HTTP and gRPC, /metrics, the query API)")
    limits.add_argument("--max-connections", type=positive_int, default=256, metavar="N",
                        help="connections served at once by each listener (default 256); one more closes the "
                             "longest-idle keep-alive connection, or is answered 503 with Retry-After when none is")
    limits.add_argument("--header-timeout", type=duration_s, default=10.0, metavar="DURATION",
                        help="a request's line and headers must arrive within this (default 10s)")
    limits.add_argument("--body-timeout", type=duration_s, default=30.0, metavar="DURATION",
                        help="a request's whole body must arrive within this of its headers (default 30s)")
    limits.add_argument("--idle-timeout", type=duration_s, default=60.0, metavar="DURATION",
                        help="close a keep-alive connection without a request for this long (default 60s)")
    secure = p.add_argument_group("beyond localhost: TLS and credentials on every listener (OTLP/HTTP and gRPC, "
                                  "/metrics, the query API and /ui)")
    secure.add_argument("--tls-cert-file", metavar="PEM", help="serve TLS with this certificate (chain)")
    secure.add_argument("--tls-key-file", metavar="PEM", help="the certificate's private key")
    secure.add_argument("--tls-client-ca-file", metavar="PEM",
                        help="mutual TLS: clients must present a certificate this CA signed")
    secure.add_argument("--auth", metavar="KIND=PATH",
                        help="ask every request for credentials: bearer-token-file=PATH (Authorization: Bearer "
                             "<the file's token>; re-read when it changes) or htpasswd-file=PATH (basic auth; plain, "
                             "{SHA} or bcrypt lines)")
    scrape = p.add_argument_group("scraping Prometheus /metrics (vLLM's, SGLang's, any exporter's)")
    scrape.add_argument("--scrape-target", action="append", default=[], metavar="[JOB=]URL",
                        help="pull this Prometheus/OpenMetrics endpoint every --scrape-interval (repeatable), e.g. "
                             "vllm=http://10.0.0.5:8000/metrics; job defaults to `scrape`, instance is host:port. "
                             "Families a profile knows (vLLM's) come out under --metrics-compat's names")
    scrape.add_argument("--scrape-interval", type=duration_s, default=15.0, metavar="DURATION",
                        help="how often each --scrape-target is pulled (default 15s)")
    scrape.add_argument("--scrape-timeout", type=duration_s, default=None, metavar="DURATION",
                        help="a scrape's whole time limit (default 10s, at most the interval)")
    scrape.add_argument("--scrape-config", metavar="FILE",
                        help="targets from a prometheus.yml-style file (scrape_configs with job_name, "
                             "scrape_interval, scrape_timeout, metrics_path, scheme, sample_limit, body_size_limit, "
                             "static_configs)")
    store = p.add_argument_group("trace store: traces kept on this host, served by Jaeger's query API")
    store.add_argument("--trace-store", metavar="DIR",
                       help="keep traces in a SQLite file in DIR and serve Jaeger's HTTP query API on --jaeger-port "
                            "(Grafana's Jaeger data source and the Jaeger UI can use it as their backend)")
    store.add_argument("--trace-retention", type=duration_s, default=24 * 3600.0, metavar="DURATION",
                       help="delete spans older than this (default 24h)")
    store.add_argument("--trace-store-max-mib", type=positive_int, default=1024, metavar="MIB",
                       help="keep the database under this size; the oldest spans go first (default 1024)")
    store.add_argument("--jaeger-port", type=port, default=16686, help="the query API's port (default 16686)")
    sampling = p.add_argument_group("tail sampling of traces (with --traces-to or --trace-store)")
    sampling.add_argument("--tail-sampling", action="store_true",
                          help="hold each trace until its root span arrives, then keep it if a request failed, was "
                               "aborted or preempted, or was slow (the thresholds below), else keep "
                               "--keep-fraction of them")
    sampling.add_argument("--keep-ttft-above", type=_threshold, default=2.0, metavar="DURATION",
                          help="keep traces whose time to first token is above this (default 2s; off)")
    sampling.add_argument("--keep-e2e-above", type=_threshold, default=60.0, metavar="DURATION",
                          help="keep traces whose end-to-end latency is above this (default 60s; off)")
    sampling.add_argument("--keep-queue-above", type=_threshold, default=5.0, metavar="DURATION",
                          help="keep traces that waited in the queue longer than this (default 5s; off)")
    sampling.add_argument("--keep-fraction", type=_fraction, default=0.1,
                          help="of the other traces, keep this fraction, by trace id (default 0.1)")
    sampling.add_argument("--decision-wait", type=duration_s, default=10.0, metavar="DURATION",
                          help="decide a trace whose root has not arrived this long after its first span "
                               "(default 10s)")
    sampling.add_argument("--lane-wait", type=duration_s, default=60.0, metavar="DURATION",
                          help="an engine lane window (the `engine steps` span) waits this long for the requests "
                               "that ran in it, and is kept when a kept request of its server overlaps it "
                               "(default 60s)")
    at_scale = p.add_argument_group("beyond one host: the OpenTelemetry Collector Contrib")
    at_scale.add_argument("--print-otelcol-config", action="store_true",
                          help="print an otelcol-contrib YAML config that does what this collector does "
                               "with the same --metrics-compat names, listeners, --remote-write-url, --traces-to, "
                               "--storage-dir, tail sampling, --tls-* and --auth flags, then exit")
    at_scale.add_argument("--otelcol-traces-endpoint", metavar="HOST:PORT",
                          help="with --print-otelcol-config: also a trace exporter `otlp/traces` to this OTLP/gRPC "
                               "backend (e.g. jaeger:4317; TLS if it starts with https://)")


def scrape_targets(args: argparse.Namespace) -> tuple:
    """--scrape-target and --scrape-config -> ScrapeTargets. Raises ValueError naming the flag or file."""
    from otel_llm.collector.receiver.scrape import load_scrape_config, parse_target

    timeout = args.scrape_timeout
    if timeout is not None and timeout > args.scrape_interval:
        raise ValueError(f"--scrape-timeout {timeout:g}s is longer than --scrape-interval {args.scrape_interval:g}s")
    targets = []
    for text in args.scrape_target:
        try:
            targets.append(parse_target(text, args.scrape_interval, timeout))
        except ValueError as exc:
            raise ValueError(f"--scrape-target {text!r}: {exc}") from None
    if args.scrape_config:
        targets += load_scrape_config(args.scrape_config)
    seen = set()
    for t in targets:
        if (t.job, t.instance) in seen:
            raise ValueError(f"two scrape targets are job {t.job!r}, instance {t.instance!r}: give them different jobs")
        seen.add((t.job, t.instance))
    return tuple(targets)


def security_from_args(args: argparse.Namespace) -> dict:
    """--tls-* and --auth -> HttpServerSettings' tls and auth, the files read and checked now.
    Raises ValueError naming the flag."""
    from otel_llm.cli.tls import tls_config
    from otel_llm.collector.extension.auth import parse_auth

    tls = tls_config(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
    try:
        auth = None if args.auth is None else parse_auth(args.auth)
    except ValueError as exc:
        raise ValueError(f"--auth: {exc}") from None
    return {"tls": tls, "auth": auth}


def config_from_args(args: argparse.Namespace):
    from otel_llm.collector.exporter.prometheus.metric_store import StoreConfig
    from otel_llm.collector.http_endpoint import HttpServerSettings
    from otel_llm.collector.processor.tail_sampling import TailSamplingConfig
    from otel_llm.collector.service import CollectorConfig
    from otel_llm.collector.tracestore.store import TraceStoreConfig

    sampling = TailSamplingConfig(
        decision_wait_s=args.decision_wait, ttft_above_s=args.keep_ttft_above, e2e_above_s=args.keep_e2e_above,
        queue_above_s=args.keep_queue_above, keep_fraction=args.keep_fraction,
        lane_wait_s=args.lane_wait) if args.tail_sampling else None

    return CollectorConfig(
        host=args.host or "127.0.0.1", otlp_http_port=args.otlp_http_port, otlp_grpc_port=args.otlp_grpc_port,
        prometheus_port=args.prometheus_port, remote_write_urls=tuple(args.remote_write_url),
        metrics_to=tuple(args.metrics_to),
        traces_to=tuple(args.traces_to), storage_dir=args.storage_dir, tail_sampling=sampling,
        trace_store=None if args.trace_store is None else TraceStoreConfig(
            args.trace_store, retention_s=args.trace_retention, max_bytes=args.trace_store_max_mib * 1024 * 1024),
        jaeger_port=args.jaeger_port, phase_spans=args.phase_spans, scrape_targets=scrape_targets(args),
        http_server=HttpServerSettings(max_connections=args.max_connections, header_timeout_s=args.header_timeout,
                                       body_timeout_s=args.body_timeout, idle_timeout_s=args.idle_timeout,
                                       **security_from_args(args)),
        store=StoreConfig(profile=args.metrics_compat, expiry_s=args.metric_expiry,
                          cardinality_limit=args.cardinality_limit, max_series=args.max_series),
    )


def print_otelcol_config(args: argparse.Namespace) -> int:
    from otel_llm.collector.otelcol.config import render_otelcol_config

    if args.trace_store:
        print("otel-llm collector: error: --trace-store keeps traces on this host; otelcol-contrib has no "
              "equivalent: send them to a trace backend with --traces-to URL", file=sys.stderr)
        return 2
    if args.scrape_target or args.scrape_config:
        print("otel-llm collector: error: --scrape-target/--scrape-config are not translated into the otelcol-contrib "
              "config (its names would differ): scrape those targets with this collector, or configure "
              "otelcol-contrib's prometheus receiver yourself", file=sys.stderr)
        return 2
    if (args.storage_dir or args.tail_sampling) and not (args.traces_to or args.otelcol_traces_endpoint):
        flag = "--storage-dir" if args.storage_dir else "--tail-sampling"
        print(f"otel-llm collector: error: {flag} needs a trace exporter in the printed config: add --traces-to "
              "URL or --otelcol-traces-endpoint HOST:PORT", file=sys.stderr)
        return 2
    host = args.host or "0.0.0.0"
    try:
        config = config_from_args(args)  # built and checked as the collector builds it
        sampling, security = config.tail_sampling, config.http_server
        text = render_otelcol_config(
            args.metrics_compat, otlp_grpc_endpoint=f"{host}:{args.otlp_grpc_port}",
            otlp_http_endpoint=f"{host}:{args.otlp_http_port}", prometheus_endpoint=f"{host}:{args.prometheus_port}",
            remote_write_urls=args.remote_write_url, traces_to=args.traces_to, metrics_to=args.metrics_to,
            traces_endpoint=args.otelcol_traces_endpoint, storage_dir=args.storage_dir, tail_sampling=sampling,
            tls=security.tls, auth=security.auth)
    except ValueError as exc:
        print(f"otel-llm collector: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    from otel_llm.collector.service import Collector

    if args.print_otelcol_config:
        return print_otelcol_config(args)
    if args.otelcol_traces_endpoint:
        print("otel-llm collector: error: --otelcol-traces-endpoint only applies with --print-otelcol-config",
              file=sys.stderr)
        return 2

    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"otel-llm collector: error: {exc}", file=sys.stderr)
        return 2
    if config.storage_dir and not config.traces_to:
        print("otel-llm collector: error: --storage-dir holds trace backends' queues: add --traces-to URL",
              file=sys.stderr)
        return 2
    if config.tail_sampling and not (config.traces_to or config.trace_store):
        print("otel-llm collector: error: --tail-sampling samples the traces the collector takes: add --traces-to "
              "URL or --trace-store DIR", file=sys.stderr)
        return 2
    try:
        collector = Collector(config)
    except (OSError, sqlite3.Error) as exc:
        print(f"otel-llm collector: error: cannot open --storage-dir / --trace-store: {exc}", file=sys.stderr)
        return 1
    try:
        collector.start()
    except (OSError, RuntimeError) as exc:  # a port in use (gRPC says RuntimeError)
        print(f"otel-llm collector: error: cannot listen: {exc}", file=sys.stderr)
        collector.stop()
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    logger.info("otel-llm collector: %s", collector.describe())
    print(f"otel-llm collector ready: {collector.describe()}", flush=True)
    stop.wait()
    logger.info("otel-llm collector: stopping")
    collector.stop()
    return 0
