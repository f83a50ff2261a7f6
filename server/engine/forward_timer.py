"""How long a step's forward pass took, for the engine lane (`otel_llm.engine.step.StepLane`).

One small interface, two sources. `start()` and `stop()` bracket the forward call; `read_ns()` is
called after the step's results reached the host:

- `HostTimer` (CPU): the host time of the forward call.
- `CudaEventTimer` (CUDA): the device time between two CUDA events recorded around the forward
  call on the current stream. The step already synchronises when its sampled tokens are copied to
  the host, so by `read_ns()` both events are complete and reading them adds no sync; if the end
  event is somehow not complete yet, the step reports no forward time rather than wait.

Engine-loop thread only.
"""

from __future__ import annotations

import time

from otel_llm.engine.step import ForwardSource


class HostTimer:
    source = ForwardSource.HOST

    def __init__(self, clock=time.perf_counter_ns):
        self._clock = clock
        self._t0 = self._ns = 0

    def start(self) -> None:
        self._t0 = self._clock()

    def stop(self) -> None:
        self._ns = self._clock() - self._t0

    def read_ns(self) -> int:
        return self._ns


class CudaEventTimer:
    source = ForwardSource.CUDA

    def __init__(self, new_event=None):
        """`new_event()`: a timing event (default `torch.cuda.Event(enable_timing=True)`)."""
        if new_event is None:
            import torch

            def new_event():
                return torch.cuda.Event(enable_timing=True)
        self._start, self._end = new_event(), new_event()
        self._recorded = False

    def start(self) -> None:
        self._start.record()

    def stop(self) -> None:
        self._end.record()
        self._recorded = True

    def read_ns(self) -> int:
        """The device ns between the two events; 0 when they were not both recorded and complete."""
        if not self._recorded or not self._end.query():  # query() never blocks
            return 0
        self._recorded = False
        return round(self._start.elapsed_time(self._end) * 1e6)  # elapsed_time is in ms


def forward_timer(device) -> HostTimer | CudaEventTimer:
    """The timer for a model on `device` (a torch.device)."""
    return CudaEventTimer() if device.type == "cuda" else HostTimer()
