"""`otel-llm serve` (the reference server), `serve-pipeline` (the same server as stage 0 of a
two-stage text-to-speech pipeline, `otel_llm.server.pipeline`) and `demo` (a client); the
`otel-llm` command itself is `otel_llm.cli`.

This is the one edge where the server's flags and the environment (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`, `OTEL_LLM_API_KEY`) are read; everything below gets a frozen
`ServerConfig` (with its `EngineConfig`), and `serve-pipeline` a `PipelineServerConfig` too.
A bad value fails here, naming it, with exit code 2. Building the parsers imports no extra.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from otel_llm.cli.arg_types import int_in, port, positive_float, positive_int
from otel_llm.cli.tls import tls_config
from otel_llm.pipeline.families import PREFIXES
from otel_llm.server.config import METRICS_COMPAT, ServerConfig
from otel_llm.server.engine.config import DTYPES, EngineConfig
from otel_llm.server.model.specs import BUILTIN_MODELS
from otel_llm.server.pipeline.pipeline_config import PipelineServerConfig
from otel_llm.server.pipeline.synth_config import BACKENDS
from otel_llm.shim.custom_buckets import parse_specs
from otel_llm.slo.config import load_slo_config

logger = logging.getLogger("otel_llm.server")


def add_parsers(sub) -> None:
    """`serve`, `serve-pipeline` and `demo` under the `otel-llm` command's subparsers."""
    serve = sub.add_parser("serve", help="run the OpenAI-compatible server (API process + engine process)",
                           description="The reference serving stack: an OpenAI-compatible API (/v1/chat/completions, "
                                       "/v1/completions, /v1/models) in front of a torch engine in its own process, "
                                       "fully instrumented: vLLM's /metrics, gen_ai spans over OTLP, Triton's "
                                       "statistics at /v2/models/stats.")
    serve.set_defaults(run=run_serve, extras=("serve",))
    _add_serve_arguments(serve)
    pipeline = sub.add_parser("serve-pipeline", help="run the server as a two-stage text-to-speech pipeline: the "
                                                     "engine (stage 0) writes text, talker replicas (stage 1) speak "
                                                     "it (chat requests with modalities [\"text\", \"audio\"])",
                              description="`serve` with a second stage: talker replicas turn the engine's text into "
                                          "audio, streamed as the chat API's audio deltas; vLLM-Omni's pipeline, "
                                          "transfer and audio families on /metrics.")
    pipeline.set_defaults(run=run_serve, extras=("serve",))
    _add_serve_arguments(pipeline)
    pipeline.add_argument("--talker-replicas", type=positive_int, default=PipelineServerConfig.talker_replicas,
                          metavar="N", help="stage-1 replicas (threads); a request stays on the least loaded one "
                                            "at its arrival (default: 2)")
    pipeline.add_argument("--talker-backend", choices=BACKENDS, default=PipelineServerConfig.talker_backend,
                          help="tone: the built-in synthesiser, a note per character (default); espeak: speech "
                               "from the espeak-ng program, which must be installed")
    pipeline.add_argument("--omni-metrics-prefix", choices=PREFIXES, default=PipelineServerConfig.omni_metrics_prefix,
                          help="the pipeline families' prefix: vLLM-Omni's vllm_omni: (default) or its design's "
                               "first release's vllm:omni_")

    demo = sub.add_parser("demo", help="send a few chat requests to a running server and summarise /metrics",
                          description="A client: chat requests with the openai library against a running server, "
                                      "then its server-side TTFT, ITL and end-to-end latency from /metrics.")
    demo.set_defaults(run=run_demo, extras=("serve",))
    demo.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    demo.add_argument("--requests", type=positive_int, default=16, help="chat requests to send (default 16)")
    demo.add_argument("--concurrency", type=positive_int, default=8, help="at most this many at once (default 8)")
    demo.add_argument("--max-tokens", type=positive_int, default=48, help="max_tokens of each request (default 48)")
    demo.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    demo.add_argument("--api-key", default=None,
                      help="the server's API key, if it asks for one (default: $OTEL_LLM_API_KEY)")
    demo.add_argument("--timeline-url", default=None,
                      help="a collector's request timeline page (http://HOST:16686/ui) that keeps the server's "
                           "traces: the demo links its requests there")


def _add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """The flags of `serve`, which `serve-pipeline` shares."""
    serve.add_argument("--model", default="dummy", help=f"{' | '.join(BUILTIN_MODELS)} | a Hugging Face Llama directory")
    serve.add_argument("--served-model-name", default=None, help="name clients use (default: the model's name)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1, this host only; 0.0.0.0 for all)")
    serve.add_argument("--port", type=port, default=8000, help="port to listen on (default 8000)")
    serve.add_argument("--dtype", choices=DTYPES, default="auto",
                       help="auto: bfloat16 on CUDA, float32 on CPU (bfloat16 decodes faster on a CPU with "
                            "native bf16 but changes small models' greedy answers)")
    serve.add_argument("--device", default="auto", help="auto (CUDA when available) | cpu | cuda | cuda:N")
    serve.add_argument("--max-num-seqs", type=positive_int, default=64,
                       help="sequences the engine runs at once; the rest wait in the queue (default 64)")
    serve.add_argument("--max-num-batched-tokens", type=positive_int, default=2048,
                       help="tokens one engine step computes, prefill and decode together (default 2048)")
    serve.add_argument("--num-kv-blocks", type=positive_int, default=None,
                       help="KV cache blocks (default: sized from a memory budget, 1 GiB at most on a CPU)")
    serve.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV cache block (default 16)")
    serve.add_argument("--max-model-len", type=positive_int, default=None,
                       help="context length: prompt plus output tokens (default: the model's)")
    serve.add_argument("--seed", type=int, default=0, help="the sampler's random seed (default 0)")
    serve.add_argument("--metrics-compat", choices=METRICS_COMPAT, default="vllm",
                       help="metric names on /metrics: vLLM's (default), OTel semconv, SGLang's, TGI's or "
                            "Triton's; /metrics?compat=NAME serves any of them")
    serve.add_argument("--custom-histogram-buckets", action="append", default=[], metavar="NAME=B1,B2,...",
                       help="a histogram's bucket bounds, on /metrics and in OTLP alike (repeatable): NAME is "
                            "a vLLM bucket family (request_latency, time_to_first_token, ...), a vLLM histogram "
                            "(vllm:e2e_request_latency_seconds) or a canonical one; vLLM's JSON form "
                            "'{\"request_latency\": [0.1, 1]}' works too")
    serve.add_argument("--show-hidden-metrics-for-version", default=None, metavar="X.Y",
                       help="also serve the families vLLM hid after version X.Y under their old names "
                            "(0.8: time_in_queue_requests; 0.10: gpu_cache_usage_perc, gpu_prefix_cache_*; "
                            "0.11: time_per_output_token_seconds)")
    serve.add_argument("--kv-cache-metrics", action="store_true",
                       help="vLLM's KV block residency histograms (vllm:kv_block_lifetime_seconds, "
                            "_idle_before_evict_seconds, _reuse_gap_seconds) over a sample of the blocks")
    serve.add_argument("--kv-cache-metrics-sample", type=positive_float, default=0.01, metavar="RATE",
                       help="with --kv-cache-metrics: the fraction of KV blocks sampled, in (0, 1] (default 0.01)")
    serve.add_argument("--enable-mfu-metrics", action="store_true",
                       help="vLLM's estimated FLOPs and memory traffic per GPU (vllm:estimated_flops_per_gpu_total, "
                            "_read_bytes_per_gpu_total, _write_bytes_per_gpu_total), from the model's shape per step")
    serve.add_argument("--engine-lane", action=argparse.BooleanOptionalAction, default=True,
                       help="every engine step as telemetry: its start, forward time, tokens, batch and why the "
                            "queue waits (default on; --no-engine-lane leaves it out)")
    serve.add_argument("--slo-config", default=None, metavar="FILE",
                       help="SLO objectives (YAML; see docs/slo.md): each finished request is judged against "
                            "them and counted in otel_llm_slo_requests_total{missed} (goodput); the same file "
                            "makes the rules and dashboards (otel-llm slo rules|dashboard)")
    serve.add_argument("--return-timings", action="store_true",
                       help="every generation response carries a `timings` object (queue, prefill, TTFT, decode, "
                            "TPOT, e2e, tokens, steps) and every traced response the W3C `traceresponse` header; "
                            "without it a request asks with \"return_timings\": true (and may decline with false)")
    serve.add_argument("--null-step-ms", type=positive_float, default=None, metavar="MS",
                       help="with --model null: every engine step takes at least MS milliseconds, as a GPU's "
                            "forward pass would, to measure the frontend at that step rate (default: no pause)")
    serve.add_argument("--cardinality-limit", type=positive_int, default=ServerConfig.cardinality_limit, metavar="N",
                       help="series per metric for label values from outside (LoRA adapters, model names): "
                            "beyond N they go into one otel_metric_overflow=\"true\" series, counted in "
                            "otel_llm_metric_overflow_measurements_total (default: 2000)")
    serve.add_argument("--otlp-traces-endpoint", default=None,
                       help="OTLP/HTTP traces endpoint (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
                            "then $OTEL_EXPORTER_OTLP_ENDPOINT; none: no export)")
    serve.add_argument("--otlp-metrics-endpoint", default=None,
                       help="push OTLP metrics here, e.g. an otel-llm collector's http://127.0.0.1:4318 "
                            "(default: $OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, then $OTEL_EXPORTER_OTLP_ENDPOINT; "
                            "none: no push); every $OTEL_METRIC_EXPORT_INTERVAL ms (60000), over "
                            "$OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL (http/protobuf or grpc)")
    serve.add_argument("--disable-log-stats", action="store_true", help="turn telemetry off (no /metrics families, no spans, no stat log)")
    serve.add_argument("--log-stats-interval", type=positive_float, default=10.0, help="seconds between stat log lines (default 10)")
    serve.add_argument("--in-process", action="store_true", help="run the engine in a thread of the API process")
    serve.add_argument("--max-recv-per-iter", type=positive_int, default=64,
                       help="commands the engine loop drains per iteration (default 64)")
    serve.add_argument("--engine-threads", type=positive_int, default=None,
                       help="torch threads in the engine (default: cores - 1)")
    serve.add_argument("--access-log", action="store_true", help="turn uvicorn's access log on")
    serve.add_argument("--engine-restarts", type=int_in(0), default=ServerConfig.engine_restarts,
                       help="restart a dead or hung engine at most N times in a row, with backoff (0: never; "
                            "an engine that ran for a minute starts the count afresh)")
    serve.add_argument("--engine-heartbeat-timeout", type=positive_float,
                       default=ServerConfig.engine_heartbeat_timeout_s, metavar="SECONDS",
                       help="an engine not heard from (no step, no heartbeat) for this long is hung: its "
                            "requests fail, it is killed and restarted")
    serve.add_argument("--shutdown-timeout", type=positive_float, default=ServerConfig.shutdown_timeout_s,
                       metavar="SECONDS",
                       help="SIGTERM to exit at most this long: requests in flight get half of it, then they are "
                            "aborted; spans and metrics are flushed in what is left, the rest dropped (logged)")
    serve.add_argument("--max-request-bytes", type=positive_int, default=ServerConfig.max_request_bytes,
                       help="larger request bodies are answered 413 before they are read (default: 4 MiB, "
                            "far above any prompt that fits the context)")
    serve.add_argument("--max-num-queued-reqs", type=positive_int, default=None, metavar="N",
                       help="vLLM's admission limit: a request that would take the unfinished sequences (waiting "
                            "or running; n counts n) above N is refused (default: no limit)")
    serve.add_argument("--max-num-queued-tokens", type=positive_int, default=None, metavar="N",
                       help="vLLM's admission limit: while the requests not yet past prefill hold N prompt tokens or "
                            "more, new requests are refused (default: no limit)")
    serve.add_argument("--admission-status", type=int, choices=(429, 503), default=ServerConfig.admission_status,
                       help="the status of a refused request: 429 Too Many Requests (default), or 503 with "
                            "vLLM's exact body (vLLM answers 503)")
    serve.add_argument("--header-timeout", type=positive_float, default=ServerConfig.header_timeout_s,
                       metavar="SECONDS", help="a connection that has not sent a request's whole headers this long "
                                               "after it opened (or after the request's first byte, on a kept-alive "
                                               "connection) is closed, counted in otel_llm_http_read_timeouts_total "
                                               "(nginx's client_header_timeout; default 10)")
    serve.add_argument("--body-timeout", type=positive_float, default=ServerConfig.body_timeout_s, metavar="SECONDS",
                       help="a request whose whole body has not arrived this long after its headers is closed, "
                            "counted the same way (default 60: the default 4 MiB at 70 KB/s)")
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="/v1/* need `Authorization: Bearer KEY`, else 401 (vLLM's --api-key); /health, /metrics "
                            "and /v2 stay open (default: $OTEL_LLM_API_KEY, which unlike a flag other users of "
                            "the host cannot read in the process list; none: no key needed)")
    serve.add_argument("--tls-cert-file", default=None, metavar="PEM",
                       help="serve HTTPS with this certificate (chain), with --tls-key-file")
    serve.add_argument("--tls-key-file", default=None, metavar="PEM", help="the certificate's private key "
                                                                           "(unencrypted)")
    serve.add_argument("--tls-client-ca-file", default=None, metavar="PEM",
                       help="mutual TLS: clients must present a certificate signed by these CAs")


_FLAG_OF_FIELD = {"num_threads": "engine-threads"}  # EngineConfig fields whose flag is not their name


def _flag_message(message: str) -> str:
    """EngineConfig names fields ("max_model_len=4096: ..."); the CLI user typed flags."""
    field, sep, rest = message.partition("=")
    if not sep or not field.isidentifier():
        return message
    return f"--{_FLAG_OF_FIELD.get(field, field.replace('_', '-'))} {rest}"


def config_from_args(args: argparse.Namespace, environ=os.environ) -> ServerConfig:
    """Raises ValueError naming the bad value."""
    if args.kv_cache_metrics_sample > 1:
        raise ValueError(f"--kv-cache-metrics-sample {args.kv_cache_metrics_sample}: must be in (0, 1]")
    if args.null_step_ms is not None and (args.model != "null" or args.null_step_ms > 60_000):
        raise ValueError(f"--null-step-ms {args.null_step_ms:g}: needs --model null and at most 60000 ms")
    endpoint = (args.otlp_traces_endpoint or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)
    metrics_endpoint = (args.otlp_metrics_endpoint or environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
                        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)
    engine = EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, num_kv_blocks=args.num_kv_blocks,
        block_size=args.block_size, max_model_len=args.max_model_len, seed=args.seed,
        log_stats=not args.disable_log_stats, num_threads=args.engine_threads, engine_lane=args.engine_lane,
        kv_cache_metrics_sample=args.kv_cache_metrics_sample if args.kv_cache_metrics else 0.0,
        null_step_s=(args.null_step_ms or 0.0) / 1e3,
    )
    return ServerConfig(
        engine=engine, served_model_name=args.served_model_name, host=args.host, port=args.port,
        in_process=args.in_process, max_recv_per_iter=args.max_recv_per_iter,
        log_stats_interval_s=args.log_stats_interval, metrics_compat=args.metrics_compat,
        custom_histogram_buckets=parse_specs(args.custom_histogram_buckets),
        show_hidden_metrics_for_version=args.show_hidden_metrics_for_version,
        cardinality_limit=args.cardinality_limit,
        otlp_traces_endpoint=endpoint, otlp_metrics_endpoint=metrics_endpoint, access_log=args.access_log,
        max_request_bytes=args.max_request_bytes, max_num_queued_reqs=args.max_num_queued_reqs,
        max_num_queued_tokens=args.max_num_queued_tokens, admission_status=args.admission_status, engine_restarts=args.engine_restarts,
        engine_heartbeat_timeout_s=args.engine_heartbeat_timeout, shutdown_timeout_s=args.shutdown_timeout,
        header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
        api_key=args.api_key if args.api_key is not None else environ.get("OTEL_LLM_API_KEY") or None,
        tls=tls_config(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file),
        slo=None if args.slo_config is None else load_slo_config(args.slo_config),
        return_timings=args.return_timings, mfu_metrics=args.enable_mfu_metrics,
    )


def pipeline_config_from_args(args: argparse.Namespace) -> PipelineServerConfig:
    """`serve-pipeline`'s own flags. Raises ValueError naming the bad value (a backend that cannot run too)."""
    return PipelineServerConfig(talker_replicas=args.talker_replicas, talker_backend=args.talker_backend,
                                omni_metrics_prefix=args.omni_metrics_prefix)


def serve(config: ServerConfig, pipeline: PipelineServerConfig | None = None) -> int:
    """Run the server until SIGINT/SIGTERM; `pipeline`: as `otel-llm serve-pipeline`."""
    from otel_llm.server.engine_process import cap_threads

    # One torch thread in the API process (it only tokenizes); the engine gets the rest.
    cap_threads(config.engine_threads if config.in_process else 1)
    # The event loop streams tokens; background threads (span export, the engine reader)
    # must hand the GIL back quickly, not after the default 5 ms.
    sys.setswitchinterval(0.001)
    import uvicorn

    from otel_llm.server.api import create_app
    from otel_llm.server.api.arrival import stamping_protocol
    from otel_llm.server.api.read_timeouts import timed_protocol
    from otel_llm.server.api.shutdown import BoundedServer, ShutdownClock
    from otel_llm.server.engine_client import EngineClient
    from otel_llm.server.engine_supervisor import EngineStartError

    client = EngineClient(config)
    try:
        client.start()
    except EngineStartError as exc:
        logger.error("%s", exc)
        print(f"otel-llm serve: error: {exc}", file=sys.stderr)
        return 2 if exc.config_error else 1
    clock = ShutdownClock(config.shutdown_timeout_s)

    def drain_deadline() -> None:
        ended = client.end_requests("the server is shutting down")
        if ended:
            logger.warning("shutdown: %d request(s) still in flight after %g s; aborted", ended, clock.drain_s)

    app = create_app(config, client, clock, pipeline)
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, access_log=config.access_log,
                               log_config=None, http=timed_protocol(stamping_protocol(), app.state.read_timeouts),
                               timeout_graceful_shutdown=clock.drain_s + 1,  # uvicorn's own cut, if ours failed
                               **(config.tls.uvicorn_kwargs() if config.tls is not None else {}))
    try:
        BoundedServer(uv_config, clock, drain_deadline).run()
    finally:
        client.close()
    return 0


def run_demo(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    from otel_llm.server import demo

    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return demo.run_demo(args.url, args.requests, args.concurrency, args.max_tokens, args.model, args.timeline_url,
                         args.api_key if args.api_key is not None else os.environ.get("OTEL_LLM_API_KEY") or None)


def run_serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`serve` and `serve-pipeline`: a bad flag value ends with the parser's usage error (exit 2)."""
    try:
        config = config_from_args(args)
        pipeline = pipeline_config_from_args(args) if args.command == "serve-pipeline" else None
    except ValueError as exc:
        parser.error(_flag_message(str(exc)))  # exits 2
    return serve(config, pipeline)
