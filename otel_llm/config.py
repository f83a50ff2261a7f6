"""TelemetryConfig: the one validated configuration object of a `Telemetry`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROFILE_NAMES = ("vllm", "otel")


@dataclass(frozen=True)
class TelemetryConfig:
    """Configuration of one model/engine's telemetry. Invalid values raise ValueError at construction.

    - `enabled=False` (vLLM's `--disable-log-stats`): nothing is recorded or registered.
    - `tracer_provider`: an SDK TracerProvider; None = build one with an OTLP exporter when
      `otlp_traces_endpoint` or `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` is set, else use the
      global provider if it is an SDK one, else no tracing.
    - `capture_content`: None = `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`.
    - `cache_config`: labels of `vllm:cache_config_info` (values are turned into strings).
    """

    model_name: str
    engine: str = "0"
    enabled: bool = True
    log_stats: bool = True
    log_stats_interval_s: float = 10.0
    max_model_len: int = 8192
    cache_config: Mapping[str, Any] = field(default_factory=dict)
    metrics_compat: str = "vllm"
    provider_name: str = "otel_llm"
    tracing: bool = True
    tracer_provider: Any = None
    otlp_traces_endpoint: str | None = None
    capture_content: bool | None = None
    model_version: str = "1"
    kv_device: str = "GPU"  # the word in the log line: "GPU KV cache usage"

    def __post_init__(self):
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError(f"model_name must be a non-empty string, got {self.model_name!r}")
        if not isinstance(self.engine, str):
            raise ValueError(f"engine must be a string, got {self.engine!r}")
        if not (self.log_stats_interval_s > 0):
            raise ValueError(f"log_stats_interval_s must be > 0, got {self.log_stats_interval_s!r}")
        if not isinstance(self.max_model_len, int) or self.max_model_len < 1:
            raise ValueError(f"max_model_len must be a positive int, got {self.max_model_len!r}")
        if self.metrics_compat not in PROFILE_NAMES:
            raise ValueError(f"metrics_compat must be one of {PROFILE_NAMES}, got {self.metrics_compat!r}")
