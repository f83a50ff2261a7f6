"""TelemetryConfig: the one validated configuration object of a `Telemetry`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from os import PathLike
from typing import Any

from otel_llm.canonical.cardinality import DEFAULT_CARDINALITY_LIMIT, check_limit
from otel_llm.canonical.instruments import DEFAULT_MODEL_VERSION
from otel_llm.engine.step import MAX_SPEC_POSITIONS
from otel_llm.shim.custom_buckets import validate
from otel_llm.shim.profile import Profile
from otel_llm.shim.profiles import PROFILE_NAMES, get_profile, resolve_custom_buckets
from otel_llm.shim.vllm import hidden_version
from otel_llm.slo.config import SloConfig, load_slo_config


@dataclass(frozen=True)
class TelemetryConfig:
    """Configuration of one model/engine's telemetry. Invalid values raise ValueError at construction.

    - `enabled=False` (vLLM's `--disable-log-stats`): nothing is recorded or registered.
    - `tracer_provider`: an SDK TracerProvider; None = build one with an OTLP exporter when
      `otlp_traces_endpoint` or `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` is set, else use the
      global provider if it is an SDK one, else no tracing.
    - `capture_content`: None = `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`.
    - `cache_config`: labels of `vllm:cache_config_info` (values are turned into strings).
    - `max_loras`: vLLM's `--max-loras`; 0 (no LoRA config) leaves `vllm:lora_requests_info` out.
    - `cardinality_limit`: series per instrument for attributes whose values come from outside
      (LoRA adapters; base label sets of Telemetries rendered or exported together); more go
      into one `otel_metric_overflow="true"` series (see `cardinality.py`).
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
    model_version: str = DEFAULT_MODEL_VERSION
    kv_device: str = "GPU"  # the word in the log line: "GPU KV cache usage"
    custom_histogram_buckets: Mapping[str, Any] = field(default_factory=dict)  # see custom_buckets.py
    show_hidden_metrics_for_version: str | None = None  # vLLM's flag: renamed families under old names
    max_loras: int = 0
    cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT
    num_speculative_tokens: int = 0  # vLLM's: > 0 shows the vllm:spec_decode_* families, positions 0..k-1
    kv_cache_metrics: bool = False  # vLLM's --kv-cache-metrics: shows the vllm:kv_block_* residency histograms
    mfu_metrics: bool = False  # vLLM's --enable-mfu-metrics: shows the vllm:estimated_*_per_gpu counters
    # vLLM-Omni: (stage, replica) of this engine in a multi-stage pipeline; its vllm:* families then carry
    # `stage` and `replica` instead of `engine` (`Profile.stage_replica`; see otel_llm/pipeline/telemetry.py)
    stage_replica: tuple[str, str] | None = None
    # SLO objectives (`otel_llm.slo.config`): an SloConfig, or the path of its YAML file (read and validated
    # here); goodput (`otel_llm.slo.requests`) is counted and exported only with one
    slo: Any = None

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
        hidden_version(self.show_hidden_metrics_for_version)
        if isinstance(self.max_loras, bool) or not isinstance(self.max_loras, int) or self.max_loras < 0:
            raise ValueError(f"max_loras must be an int >= 0, got {self.max_loras!r}")
        check_limit(self.cardinality_limit)
        if not isinstance(self.num_speculative_tokens, int) or not 0 <= self.num_speculative_tokens <= MAX_SPEC_POSITIONS:
            raise ValueError(f"num_speculative_tokens must be an int in 0..{MAX_SPEC_POSITIONS}, "
                             f"got {self.num_speculative_tokens!r}")
        sr = self.stage_replica
        if sr is not None and not (isinstance(sr, tuple) and len(sr) == 2 and all(isinstance(v, str) and v for v in sr)):
            raise ValueError(f"stage_replica must be None or a (stage, replica) pair of non-empty strings, got {sr!r}")
        self.histogram_buckets  # noqa: B018 (validates)
        if self.slo is not None and not isinstance(self.slo, SloConfig):
            if not isinstance(self.slo, (str, PathLike)):
                raise ValueError(f"slo must be None, an SloConfig or the path of an SLO file, got {self.slo!r}")
            object.__setattr__(self, "slo", load_slo_config(self.slo))

    @cached_property
    def histogram_buckets(self) -> dict[str, tuple[float, ...]]:
        """`custom_histogram_buckets`, validated, as {canonical histogram: bounds}."""
        return resolve_custom_buckets({name: validate(name, list(bounds) if isinstance(bounds, tuple) else bounds)
                                       for name, bounds in self.custom_histogram_buckets.items()})

    def profile(self, name: str | None = None) -> Profile:
        """A profile's table under this configuration (default: `metrics_compat`); with `stage_replica`,
        its base labels are (model, stage, replica) instead of (model, engine) (vLLM-Omni's reshape)."""
        return get_profile(name or self.metrics_compat, self.max_model_len, self.histogram_buckets,
                           self.show_hidden_metrics_for_version, self.num_speculative_tokens, self.kv_cache_metrics,
                           self.stage_replica is not None, self.slo is not None, self.mfu_metrics)
