"""Shared builders: a Telemetry with injectable clocks and an in-memory span pipeline."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import StepRecorder, Telemetry, TelemetryConfig


class Clock:
    """A settable monotonic ns clock."""

    def __init__(self, t: int = 1_000_000_000):
        self.t = t

    def __call__(self) -> int:
        return self.t


class Harness:
    def __init__(self, **config):
        self.fclock, self.eclock = Clock(), Clock(50_000_000_000)
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        cfg = {"model_name": "m", "log_stats": False, "tracer_provider": self.provider, **config}
        self.tel = Telemetry(TelemetryConfig(**cfg), clock=self.fclock)
        self.rec = StepRecorder(clock=self.eclock)

    def step(self, engine_ts: int, frontend_ts: int, prompt_tokens: int = 0) -> None:
        """End the engine step at engine_ts; the frontend ingests it at frontend_ts."""
        self.eclock.t = engine_ts
        data = self.rec.end_step_bytes(prompt_tokens)
        self.fclock.t = frontend_ts
        self.tel.ingest(data)

    def at(self, engine_ts: int):
        self.eclock.t = engine_ts
        return self.rec

    def hist(self, name: str):
        return self.tel.snapshot().histograms[name]

    def counter(self, name: str):
        return self.tel.snapshot().counters[name]

    def dropped(self) -> dict[str, int]:
        """Drops by reason, as a read sees them (a read folds pending finishes, whose checks count drops)."""
        self.tel.snapshot()
        return self.tel.table.dropped


@pytest.fixture
def h() -> Harness:
    return Harness()


@pytest.fixture(params=["with spans", "metrics only"])
def h_any(request) -> Harness:
    """Both ways finished requests are folded: with a tracer at each finish (spans are emitted
    then), without one in batches and before every read (`RequestTable.fold`)."""
    return Harness() if request.param == "with spans" else Harness(tracer_provider=None, tracing=False)
