"""`EngineConfig`: the engine's one validated configuration."""

from __future__ import annotations

import os
from dataclasses import dataclass

from otel_llm.server.model.specs import BUILTIN_MODELS

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineConfig:
    """How to build an `LLMEngine`. Bad values raise ValueError naming the field and value.

    model: a `otel_llm.server.model.load_model` spec: "dummy", "null" (no forward pass: a fixed token
        cycle, to measure everything else), "smollm2", or an existing path (a HF directory).
    dtype: "auto" (bfloat16 on CUDA, float32 on CPU), or a dtype name.
    device: "auto" (CUDA when available), "cpu", "cuda", "cuda:N".
    num_kv_blocks: None sizes the KV cache from a memory budget (CPU: 1 GiB at most,
        CUDA: half the free memory), never beyond what max_num_seqs full-length
        sequences need.
    max_model_len: None = the model's max_position_embeddings.
    snapshot_interval_s: at most one scheduler snapshot per interval (plus on
        the first step and when running/waiting turn to or from 0).
    log_stats: False turns the StepRecorder off (StepOutput.telemetry is None).
    engine_lane: every step record carries the step itself (`StepLane`: start, forward time, tokens,
        batch, why the queue waits, vLLM's FLOPs/bytes estimates); with log_stats only.
    num_threads: torch CPU threads (None: at most 2, leaving one core to the API process).
    null_step_s: the "null" model only: every step takes at least this long, as a GPU's forward
        pass would (0: as fast as the engine loop), so the frontend can be measured at a given
        step rate, one token per stream per step.
    """

    model: str = "dummy"
    dtype: str = "auto"
    device: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_kv_blocks: int | None = None
    block_size: int = 16
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    snapshot_interval_s: float = 1.0
    log_stats: bool = True
    engine_lane: bool = True
    seed: int = 0
    num_threads: int | None = None
    kv_cache_metrics_sample: float = 0.0  # vLLM's --kv-cache-metrics(-sample): KV blocks sampled for residency; 0: off
    null_step_s: float = 0.0

    def __post_init__(self) -> None:
        model = self.model
        if not isinstance(model, str) or not (model in BUILTIN_MODELS or os.path.exists(os.path.expanduser(model))):
            raise ValueError(f"model={model!r}: not one of {BUILTIN_MODELS} and no such path")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: must be one of {DTYPES}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device={self.device!r}: must be 'auto', 'cpu', 'cuda' or 'cuda:N'")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an int >= 1")
        for name in ("num_kv_blocks", "max_model_len", "num_threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}={value!r}: must be None or an int >= 1")
        if not self.snapshot_interval_s >= 0:
            raise ValueError(f"snapshot_interval_s={self.snapshot_interval_s!r}: must be >= 0")
        rate = self.kv_cache_metrics_sample
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise ValueError(f"kv_cache_metrics_sample={rate!r}: must be in (0, 1] (0: off)")
        step = self.null_step_s
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 <= step <= 60:
            raise ValueError(f"null_step_s={step!r}: must be in [0, 60] seconds")
        if step and model != "null":
            raise ValueError(f"null_step_s={step!r}: only the null model's steps can be paced (model={model!r})")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r}: must be an int")
