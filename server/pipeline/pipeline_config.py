"""`PipelineServerConfig`: what `otel-llm serve-pipeline` adds to `ServerConfig`, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

from otel_llm.pipeline.families import PREFIXES
from otel_llm.server.pipeline.synth import make_synth
from otel_llm.server.pipeline.synth_config import BACKENDS, SynthConfig

MAX_TALKER_REPLICAS = 64  # threads in the API process; more would only contend for the GIL


@dataclass(frozen=True)
class PipelineServerConfig:
    """The two-stage text-to-speech pipeline: stage 0 ("thinker") is the engine of `ServerConfig`,
    stage 1 ("talker") is `talker_replicas` synthesiser threads using `talker_backend` ("tone" or
    "espeak"); the pipeline families are named with `omni_metrics_prefix` ("vllm:omni_" or
    "vllm_omni:"). Raises ValueError naming the flag and the bad value (a backend that cannot run too)."""

    talker_replicas: int = 2
    talker_backend: str = "tone"
    omni_metrics_prefix: str = PREFIXES[0]

    def __post_init__(self) -> None:
        if type(self.talker_replicas) is not int or not 1 <= self.talker_replicas <= MAX_TALKER_REPLICAS:
            raise ValueError(f"--talker-replicas {self.talker_replicas!r}: must be an integer in "
                             f"[1, {MAX_TALKER_REPLICAS}]")
        if self.talker_backend not in BACKENDS:
            raise ValueError(f"--talker-backend {self.talker_backend!r}: must be one of {', '.join(BACKENDS)}")
        make_synth(SynthConfig(backend=self.talker_backend))  # espeak-ng missing: fails here, at startup
        if self.omni_metrics_prefix not in PREFIXES:
            raise ValueError(f"--omni-metrics-prefix {self.omni_metrics_prefix!r}: must be one of "
                             f"{', '.join(PREFIXES)}")
