"""Bounded shutdown: SIGTERM (or Ctrl-C) ends `otel-llm serve` with exit code 0 within
`--shutdown-timeout`, whatever its clients and its trace backend do.

From the signal:
    0        uvicorn stops accepting connections; in-flight requests may finish;
    drain    (half the timeout) what is still in flight is ended: aborted in the engine, an
             error answer or event for its client, counted `abort` (`EngineClient.end_requests`);
    then     the app's lifespan stops the engine and flushes spans and metrics with what is
             left of the timeout (`finish_within`), logging what it had to drop;
    timeout  (+1 s) if something still holds the process, it exits now, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

import uvicorn

logger = logging.getLogger(__name__)


class ShutdownClock:
    """When shutdown began, and how much of its timeout is left."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.started: float | None = None

    @property
    def drain_s(self) -> float:
        """How long in-flight requests may take to finish on their own."""
        return self.timeout_s / 2

    def begin(self) -> None:
        if self.started is None:
            self.started = time.monotonic()

    def remaining(self) -> float:
        if self.started is None:
            return self.timeout_s
        return max(0.0, self.started + self.timeout_s - time.monotonic())


class BoundedServer(uvicorn.Server):
    """uvicorn's server, with the timeline above and exit code 0 after a signal (uvicorn re-raises
    the signal once served, which makes SIGTERM's exit status 143)."""

    def __init__(self, config: uvicorn.Config, clock: ShutdownClock, on_drain_deadline: Callable[[], None]):
        super().__init__(config)
        self.clock = clock
        self.on_drain_deadline = on_drain_deadline

    async def shutdown(self, sockets=None) -> None:
        self.clock.begin()
        threading.Thread(target=self._guard, name="shutdown-guard", daemon=True).start()
        timer = asyncio.get_running_loop().call_later(self.clock.drain_s, self.on_drain_deadline)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _guard(self) -> None:
        time.sleep(self.clock.remaining() + 1.0)
        logger.error("shutdown took longer than --shutdown-timeout %g s; exiting now", self.clock.timeout_s)
        logging.shutdown()
        os._exit(0)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            self._captured_signals.clear()  # the signal asked for this shutdown, which is done: exit 0


async def finish_within(deadline_s: float, steps: dict[str, Callable[[], object]]) -> list[str]:
    """Run each of `steps` (name: a blocking call, e.g. a span processor's shutdown) on its own
    daemon thread, all at once, and wait for them at most `deadline_s`. Returns the names of
    those that had not finished (they are left behind; their threads do not hold the exit)."""
    threads = {name: threading.Thread(target=step, name=f"shutdown {name}", daemon=True)
               for name, step in steps.items()}
    for thread in threads.values():
        thread.start()
    end = time.monotonic() + deadline_s
    for thread in threads.values():
        await asyncio.to_thread(thread.join, max(0.0, end - time.monotonic()))
    return [name for name, thread in threads.items() if thread.is_alive()]
