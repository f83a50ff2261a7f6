"""otel_llm: OpenTelemetry-first observability for LLM serving.

Engine side: `StepRecorder` (stamp QUEUED/SCHEDULED/PREEMPTED, per-step outputs,
finishes, scheduler snapshots; hand the frontend one `bytes` per step).
Frontend side: `Telemetry` (request table, vLLM-parity metrics, gen_ai spans,
Triton statistics, Prometheus `/metrics`, OTel readers).
"""

from otel_llm.engine.recorder import StepRecorder
from otel_llm.engine.step import EventKind, FinishReason, SchedulerSnapshot, StepRecord
from otel_llm.frontend.config import TelemetryConfig
from otel_llm.frontend.request import RequestInfo
from otel_llm.frontend.telemetry import Telemetry

__all__ = [
    "EventKind",
    "FinishReason",
    "RequestInfo",
    "SchedulerSnapshot",
    "StepRecord",
    "StepRecorder",
    "Telemetry",
    "TelemetryConfig",
]
__version__ = "0.1.0"
