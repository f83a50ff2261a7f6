"""`PipelineStack`: what `otel-llm serve-pipeline` adds to the app of `otel-llm serve`.

`create_app(config, pipeline=PipelineServerConfig(...))` builds one in its lifespan, passes its
`serving` to `OpenAIServing` as the audio hook, appends `render` to `/metrics` (the pipeline
families after the stage engine's `vllm:*`, whose `engine` label is then `stage="0", replica="0"`)
and `close`s it at shutdown. Each stage's waiting requests are read at every read: the stage
engine's scheduler (its `Telemetry`), and each talker replica's requests not started yet. With
stats off (`--disable-log-stats`) the pipeline telemetry is disabled: it records nothing and
renders no family.
"""

from __future__ import annotations

from otel_llm.pipeline.log import PipelineStatLogger
from otel_llm.pipeline.telemetry import PipelineConfig, PipelineTelemetry
from otel_llm.server.pipeline.pipeline_config import PipelineServerConfig
from otel_llm.server.pipeline.pipeline_serving import PipelineServing
from otel_llm.server.pipeline.talker import Talker
from otel_llm.server.pipeline.talker_session import STAGE_TALKER, STAGE_THINKER, THINKER_REPLICA

STAGE_REPLICA = (STAGE_THINKER, THINKER_REPLICA)  # `TelemetryConfig.stage_replica` of the stage-0 engine


class PipelineStack:
    def __init__(self, config: PipelineServerConfig, model_name: str, enabled: bool, cardinality_limit: int,
                 tracer_provider=None, log_stats_interval_s: float = 10.0, engine_telemetry=None):
        """Starts the talker replicas' threads and the pipeline's periodic log lines (per stage and
        transfer edge, every `log_stats_interval_s`). Raises ValueError for a backend that cannot run."""
        self.telemetry = PipelineTelemetry(PipelineConfig(
            model_name=model_name, enabled=enabled, prefix=config.omni_metrics_prefix,
            cardinality_limit=cardinality_limit, tracer_provider=tracer_provider))
        self.talker = Talker(config.talker_replicas, config.talker_backend)
        if engine_telemetry is not None and engine_telemetry.enabled:
            gauges = engine_telemetry.metrics.gauges  # its latest scheduler snapshot's (None before the first)
            self.telemetry.watch_stage_waiting(*STAGE_REPLICA, lambda: int(gauges["otel_llm.scheduler.waiting"] or 0))
        for replica in self.talker.replicas:
            self.telemetry.watch_stage_waiting(STAGE_TALKER, replica.name, lambda r=replica: r.waiting)
        self.serving = PipelineServing(self.talker, self.telemetry, model_name)
        self.stat_logger = PipelineStatLogger(self.telemetry, log_stats_interval_s)

    def render(self, openmetrics: bool, compat: str = "vllm") -> bytes:
        """The pipeline families for `/metrics` (`make_metrics_app(extra=...)`); b"" with stats off."""
        return self.telemetry.render(openmetrics, compat)

    def close(self) -> None:
        self.stat_logger.stop()
        self.talker.close()
