"""`ServerConfig`: the one validated configuration of the serving stack.

Built once at the edge (`server.cli` parses flags and the environment) and passed
down, frozen. `__post_init__` raises `ValueError` naming the bad value, so a bad
flag fails at startup, never at the first request.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BUILTIN_MODELS = ("dummy", "smollm2")
METRICS_COMPAT = ("vllm", "otel")
DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class ServerConfig:
    """Everything `otel-llm serve` needs; see `server.cli` for the flag of each field."""

    model: str = "dummy"
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    # engine
    dtype: str = "auto"
    device: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_kv_blocks: int | None = None
    block_size: int = 16
    max_model_len: int | None = None
    seed: int = 0
    # process topology
    in_process: bool = False
    max_recv_per_iter: int = 64  # commands the engine loop drains per iteration
    engine_num_threads: int | None = None  # torch threads in the engine (None: all cores but one API thread)
    engine_start_timeout_s: float = 300.0
    # telemetry
    log_stats: bool = True
    log_stats_interval_s: float = 10.0
    metrics_compat: str = "vllm"
    otlp_traces_endpoint: str | None = None
    access_log: bool = False

    def __post_init__(self) -> None:
        if self.model not in BUILTIN_MODELS and not os.path.exists(self.model):
            raise ValueError(f"--model {self.model!r}: not one of {BUILTIN_MODELS} and no such path")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError(f"--served-model-name {self.served_model_name!r}: must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port {self.port}: must be in 0..65535")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}: must be one of {DTYPES}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_recv_per_iter"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} {value}: must be >= 1")
        for name in ("num_kv_blocks", "max_model_len", "engine_num_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} {value}: must be >= 1")
        if not self.log_stats_interval_s > 0:
            raise ValueError(f"--log-stats-interval {self.log_stats_interval_s}: must be > 0")
        if self.metrics_compat not in METRICS_COMPAT:
            raise ValueError(f"--metrics-compat {self.metrics_compat!r}: must be one of {METRICS_COMPAT}")
        if self.otlp_traces_endpoint is not None and not self.otlp_traces_endpoint.startswith(("http://", "https://")):
            raise ValueError(f"--otlp-traces-endpoint {self.otlp_traces_endpoint!r}: must be an http(s) URL")

    @property
    def model_name(self) -> str:
        """The name clients use (`model` in requests, `model_name` label)."""
        if self.served_model_name:
            return self.served_model_name
        return self.model if self.model in BUILTIN_MODELS else os.path.basename(os.path.normpath(self.model))

    @property
    def engine_threads(self) -> int:
        """Torch threads of the engine: all cores but one (the API process's), at least 1."""
        return self.engine_num_threads or max(1, (os.cpu_count() or 2) - 1)

    def engine_kwargs(self) -> dict:
        """Keyword arguments of `server.engine.llm_engine.EngineConfig`."""
        return dict(num_threads=self.engine_threads,
            model=self.model, dtype=self.dtype, device=self.device,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            num_kv_blocks=self.num_kv_blocks, block_size=self.block_size,
            max_model_len=self.max_model_len, log_stats=self.log_stats, seed=self.seed,
        )
