"""otel_llm: OpenTelemetry-first observability for LLM serving.

Engine side: `StepRecorder` (stamp QUEUED/SCHEDULED/PREEMPTED, per-step outputs,
finishes, scheduler snapshots; hand the frontend one `bytes` per step).
Frontend side: `Telemetry` (request table, vLLM-parity metrics, gen_ai spans,
Triton statistics, Prometheus `/metrics`, OTel readers).
"""

from .config import TelemetryConfig
from .recorder import StepRecorder
from .request import RequestInfo
from .step import EventKind, FinishReason, SchedulerSnapshot, StepRecord
from .telemetry import Telemetry

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
