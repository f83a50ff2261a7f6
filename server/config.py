"""`ServerConfig`: the one validated configuration of the serving stack.

Built once at the edge (`otel_llm.server.cli` parses flags and the environment) and passed
down, frozen. The engine's own fields live in `engine` (an `EngineConfig`, which
validates them); `__post_init__` validates the server-level fields. Both raise
`ValueError` naming the bad value, so a bad flag fails at startup, never at the
first request.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from otel_llm.canonical.cardinality import DEFAULT_CARDINALITY_LIMIT
from otel_llm.cli.tls import TlsConfig
from otel_llm.server.engine.config import EngineConfig
from otel_llm.server.model.specs import BUILTIN_MODELS
from otel_llm.shim.profiles import PROFILE_NAMES, resolve_custom_buckets
from otel_llm.shim.vllm import hidden_version
from otel_llm.slo.config import SloConfig

METRICS_COMPAT = PROFILE_NAMES


@dataclass(frozen=True)
class ServerConfig:
    """Everything `otel-llm serve` needs; see `otel_llm.server.cli` for the flag of each field."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    # process topology
    in_process: bool = False
    max_recv_per_iter: int = 64  # commands the engine loop drains per iteration
    engine_start_timeout_s: float = 300.0
    engine_restarts: int = 3  # a dead or hung engine is restarted this many times in a row at most
    engine_heartbeat_timeout_s: float = 30.0  # an engine not heard from for this long is hung
    # telemetry (on/off is engine.log_stats)
    log_stats_interval_s: float = 10.0
    mfu_metrics: bool = False  # vLLM's --enable-mfu-metrics: the vllm:estimated_*_per_gpu counters
    metrics_compat: str = "vllm"
    custom_histogram_buckets: dict[str, tuple[float, ...]] = field(default_factory=dict)  # parse_specs' result
    show_hidden_metrics_for_version: str | None = None
    cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT  # series per instrument for values from outside
    otlp_traces_endpoint: str | None = None
    otlp_metrics_endpoint: str | None = None
    access_log: bool = False
    max_request_bytes: int = 4 * 1024 * 1024  # larger bodies get 413 before they are read
    # vLLM's frontend admission limits (None: no limit); a request past one is refused (otel_llm.server.api.admission)
    max_num_queued_reqs: int | None = None  # unfinished sequences, waiting or running
    max_num_queued_tokens: int | None = None  # prompt tokens of requests not yet past prefill
    admission_status: int = 429  # of a refused request: 429, or 503 as vLLM
    shutdown_timeout_s: float = 15.0  # SIGTERM to exit, at most (Kubernetes' default grace is 30 s)
    # the trust boundary: slow clients, who may call, over what
    header_timeout_s: float = 10.0  # a connection's request headers, from its first byte (or from accept)
    body_timeout_s: float = 60.0  # a request's whole body, from the end of its headers
    api_key: str | None = field(default=None, repr=False)  # /v1/* need `Authorization: Bearer <key>`; never logged
    tls: TlsConfig | None = None  # HTTPS (and mTLS with a client CA) instead of HTTP
    slo: SloConfig | None = None  # --slo-config: objectives each finished request is judged against (goodput)
    return_timings: bool = False  # every response tells its timings and trace (a request may ask, or decline)

    def __post_init__(self) -> None:
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError(f"--served-model-name {self.served_model_name!r}: must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port {self.port}: must be in 0..65535")
        if self.max_recv_per_iter < 1:
            raise ValueError(f"--max-recv-per-iter {self.max_recv_per_iter}: must be >= 1")
        if self.engine_restarts < 0:
            raise ValueError(f"--engine-restarts {self.engine_restarts}: must be >= 0")
        if not self.engine_heartbeat_timeout_s >= 2:
            raise ValueError(f"--engine-heartbeat-timeout {self.engine_heartbeat_timeout_s}: must be >= 2 "
                             "(the engine sends a heartbeat every second)")
        if not self.shutdown_timeout_s > 0:
            raise ValueError(f"--shutdown-timeout {self.shutdown_timeout_s}: must be > 0")
        for flag, seconds in (("header", self.header_timeout_s), ("body", self.body_timeout_s)):
            if not (isinstance(seconds, (int, float)) and 0 < seconds and math.isfinite(seconds)):
                raise ValueError(f"--{flag}-timeout {seconds!r}: must be a finite number of seconds > 0")
        if self.api_key is not None and not (self.api_key and all(33 <= ord(c) <= 126 for c in self.api_key)):
            # The key itself is not named: it is a secret, and the message may be logged.
            raise ValueError("--api-key (or $OTEL_LLM_API_KEY): must be printable ASCII without spaces (an HTTP "
                             "header carries it), and not empty")
        if self.max_request_bytes < 1:
            raise ValueError(f"--max-request-bytes {self.max_request_bytes}: must be >= 1")
        for flag, limit in (("reqs", self.max_num_queued_reqs), ("tokens", self.max_num_queued_tokens)):
            if limit is not None and (type(limit) is not int or limit < 1):
                raise ValueError(f"--max-num-queued-{flag} {limit!r}: must be an integer >= 1 (or unset: no limit)")
        if self.admission_status not in (429, 503):
            raise ValueError(f"--admission-status {self.admission_status!r}: must be 429 or 503")
        if not self.log_stats_interval_s > 0:
            raise ValueError(f"--log-stats-interval {self.log_stats_interval_s}: must be > 0")
        if self.metrics_compat not in METRICS_COMPAT:
            raise ValueError(f"--metrics-compat {self.metrics_compat!r}: must be one of {METRICS_COMPAT}")
        hidden_version(self.show_hidden_metrics_for_version)
        if type(self.cardinality_limit) is not int or self.cardinality_limit < 1:
            raise ValueError(f"--cardinality-limit {self.cardinality_limit!r}: must be an integer >= 1")
        resolve_custom_buckets(self.custom_histogram_buckets)
        for flag, url in (("traces", self.otlp_traces_endpoint), ("metrics", self.otlp_metrics_endpoint)):
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"--otlp-{flag}-endpoint {url!r}: must be an http(s) URL")

    @property
    def scheme(self) -> str:
        """The URL scheme clients use: https with `tls`, else http."""
        return "http" if self.tls is None else "https"

    @property
    def model_name(self) -> str:
        """The name clients use (`model` in requests, `model_name` label)."""
        if self.served_model_name:
            return self.served_model_name
        model = self.engine.model
        return model if model in BUILTIN_MODELS else os.path.basename(os.path.normpath(model))

    @property
    def engine_threads(self) -> int:
        """Torch threads of the engine: `engine.num_threads`, else all cores but one
        (the API process's), at least 1."""
        return self.engine.num_threads or max(1, (os.cpu_count() or 2) - 1)
