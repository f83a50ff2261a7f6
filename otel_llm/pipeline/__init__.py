"""Multi-stage pipelines (vLLM-Omni): the orchestrator's telemetry of a pipeline of stages.

`PipelineTelemetry` (`telemetry`) owns a pipeline's families (`families`, vLLM-Omni's names; their
series in `series`), takes each request's stage visits, transfer hops (`hop`) and audio chunks
through a `PipelineRequest` (`request`), builds its span tree at the finish (`spans`), logs the
orchestrator's summary line (`log`), and throttles per-stage scheduler snapshots (`throttle`);
`audio_player` simulates the listener behind the audio SLOs.
"""

from otel_llm.pipeline.hop import TransferHop
from otel_llm.pipeline.log import PipelineStatLogger
from otel_llm.pipeline.telemetry import PipelineConfig, PipelineTelemetry
from otel_llm.pipeline.throttle import SnapshotThrottle

__all__ = ["PipelineConfig", "PipelineStatLogger", "PipelineTelemetry", "SnapshotThrottle", "TransferHop"]
