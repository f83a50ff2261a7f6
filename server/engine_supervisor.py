"""`EngineSupervisor`: one engine loop kept alive for the API process.

It starts the engine (a spawned process, or a thread with `in_process=True`) and blocks until
READY, sends it commands as flat bytes, and runs one background reader thread that
`recv_bytes` the engine's events and hands each one to the asyncio loop (`on_event`, one
`loop.call_soon_threadsafe` per event). What the events mean for requests is `EngineClient`'s.

If the engine dies (EOF on the pipe, FATAL message) or hangs (nothing heard, not even a
heartbeat, for `engine_heartbeat_timeout_s`: the watchdog kills it), `on_dead(reason)` runs on
the loop and `dead_reason` says why (for `/health`). Then the engine is restarted, after a
backoff (0.5 s, doubling, at most 30 s), at most `engine_restarts` times in a row (an engine
that ran for `_STABLE_S` resets the count); past that, or for an in-process engine (a hung
thread cannot be killed), `state` is "dead" for good.

Threads: the reader thread only receives and decodes (and stamps `_last_heard`); every other
piece of state is owned by the event-loop thread after `attach`. `send` may be called from
the loop thread only (one writer on the pipe); `close` from any thread.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from otel_llm.server import ipc
from otel_llm.server.config import ServerConfig

logger = logging.getLogger(__name__)

_STABLE_S = 60.0  # an engine that ran this long before dying starts the restart budget and backoff afresh
_MAX_BACKOFF_S = 30.0


class EngineStartError(RuntimeError):
    """The engine did not come up. `config_error`: it rejected a configured value."""

    def __init__(self, message: str, config_error: bool = False):
        super().__init__(message)
        self.config_error = config_error


class EngineSupervisor:
    def __init__(self, config: ServerConfig, on_event: Callable[[object], None], on_dead: Callable[[str], None]):
        self.config = config
        self._on_event, self._on_dead_callback = on_event, on_dead
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proc = None
        self._thread: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._conn = None
        self._closing = False
        self.dead_reason: str | None = None  # None while an engine serves
        self.given_up = False  # no engine, and none will be started again
        self.restarts = 0  # engines started after one died or hung
        self._consecutive = 0  # restarts since the last engine that ran for _STABLE_S
        self._generation = 0  # which engine the reader and the watchdog are watching
        self._started_at = 0.0
        self._last_heard = 0.0  # monotonic s of the engine's last message (set by the reader thread)
        self._watchdog: asyncio.Task | None = None
        self.model_name = ""
        self.max_model_len = 0
        self.engine_pid = 0

    @property
    def state(self) -> Literal["ready", "restarting", "dead"]:
        if self.dead_reason is None:
            return "ready"
        return "dead" if self.given_up else "restarting"

    def start(self) -> None:
        """Start the engine and block until it is READY. Raises EngineStartError."""
        ready = self._launch()
        self.model_name, self.max_model_len, self.engine_pid = ready
        logger.info("engine ready: model %s, max_model_len %d, pid %d (%s)", ready.model_name,
                    ready.max_model_len, ready.pid, "in-process thread" if self.config.in_process else "process")

    def _launch(self) -> ipc.Ready:
        """Start an engine (process or thread) and block until it is READY. Raises EngineStartError."""
        cfg = self.config
        ctx = mp.get_context("spawn")
        api_conn, engine_conn = ctx.Pipe(duplex=True)
        engine = replace(cfg.engine, num_threads=cfg.engine_threads)
        if cfg.in_process:
            from otel_llm.server.engine_process import run_engine

            self._thread = threading.Thread(
                target=run_engine, args=(engine_conn, engine, cfg.max_recv_per_iter), name="engine-loop", daemon=True,
            )
            self._thread.start()
        else:
            from otel_llm.server.engine_process import engine_main

            # The EngineConfig (a frozen dataclass) is pickled once, here, into the new process.
            self._proc = ctx.Process(
                target=engine_main, args=(engine_conn, engine, cfg.max_recv_per_iter),
                name="otel-llm-engine", daemon=True,
            )
            self._proc.start()
            engine_conn.close()  # the child's end lives in the child; EOF here means it died
        self._conn = api_conn
        ready = self._wait_ready()
        self._started_at = self._last_heard = time.monotonic()
        return ready

    def _wait_ready(self) -> ipc.Ready:
        """READY, else EngineStartError with the engine discarded."""
        if not self._conn.poll(self.config.engine_start_timeout_s):
            error = EngineStartError(f"engine not ready after {self.config.engine_start_timeout_s} s")
        else:
            try:
                event = ipc.decode_event(self._conn.recv_bytes())
            except EOFError:
                if self._proc is not None:
                    self._proc.join(timeout=5)
                code = self._proc.exitcode if self._proc is not None else None
                error = EngineStartError(f"engine exited during startup (exit code {code})")
            else:
                if isinstance(event, ipc.Ready):
                    return event
                error = (EngineStartError(event.message, event.config_error) if isinstance(event, ipc.Fatal) else
                         EngineStartError(f"unexpected first message from the engine: {event!r}"))
        self._discard_engine()
        raise error

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the reader thread (events are delivered on `loop`) and the watchdog."""
        self._loop = loop
        self._start_reader()
        self._watchdog = loop.create_task(self._watch())

    def _start_reader(self) -> None:
        self._generation += 1
        self._reader = threading.Thread(target=self._read_forever, args=(self._conn, self._proc, self._generation),
                                        name="engine-reader", daemon=True)
        self._reader.start()

    def send(self, command: bytes) -> None:
        """One encoded command to the engine; OSError when the pipe is gone."""
        self._conn.send_bytes(command)

    def close(self) -> None:
        """Ask the engine to stop and wait for it briefly (idempotent; any thread)."""
        self._closing = True
        if self._watchdog is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._watchdog.cancel)
        if self._conn is not None:
            try:
                self._conn.send_bytes(ipc.encode_command(ipc.Shutdown()))
            except OSError:
                pass
        if self._proc is not None:
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- reader thread ---------------------------------------------------
    def _read_forever(self, conn, proc, generation: int) -> None:
        reason = "engine closed the connection"
        try:
            while True:
                event = ipc.decode_event(conn.recv_bytes())
                self._last_heard = time.monotonic()
                if type(event) is ipc.Heartbeat:
                    continue
                if isinstance(event, ipc.Fatal):
                    reason = event.message
                    break
                self._loop.call_soon_threadsafe(self._on_event, event)
        except (EOFError, OSError):
            if proc is not None:
                proc.join(timeout=1)
                reason = f"engine process exited (exit code {proc.exitcode})"
        except BaseException:
            logger.exception("engine reader thread failed")
            reason = "engine reader thread failed"
        if not self._closing:
            self._loop.call_soon_threadsafe(self._on_dead, reason, generation)

    # -- event-loop thread -----------------------------------------------
    def _on_dead(self, reason: str, generation: int) -> None:
        if generation != self._generation or self.dead_reason is not None or self._closing:
            return  # an engine already handled (the watchdog's kill, then its EOF)
        self.dead_reason = reason
        self._on_dead_callback(reason)
        if time.monotonic() - self._started_at >= _STABLE_S:
            self._consecutive = 0
        if self.config.in_process:
            self.given_up = True
            logger.error("an in-process engine is not restarted; the server stays unavailable")
            return
        self._loop.create_task(self._restart())

    async def _restart(self) -> None:
        """Start a new engine after a backoff; on failure try again while the budget lasts."""
        while not self._closing:
            if self._consecutive >= self.config.engine_restarts:
                self.given_up = True
                logger.error("the engine will not be restarted: %d restarts in a row (--engine-restarts %d); the "
                             "server stays unavailable", self._consecutive, self.config.engine_restarts)
                return
            delay = min(_MAX_BACKOFF_S, 0.5 * 2 ** self._consecutive)
            self._consecutive += 1
            logger.warning("restarting the engine in %.1f s (attempt %d of %d)", delay, self._consecutive,
                           self.config.engine_restarts)
            await asyncio.sleep(delay)
            self._discard_engine()
            try:
                ready = await asyncio.to_thread(self._launch)
            except EngineStartError as exc:
                logger.error("engine restart failed: %s", exc)
                continue
            if self._closing:
                return
            self.restarts += 1
            self.engine_pid = ready.pid
            self.dead_reason = None
            self._start_reader()
            logger.info("engine restarted (pid %d, %d restart(s) so far)", ready.pid, self.restarts)
            return

    def _discard_engine(self) -> None:
        """Make sure the dead engine is gone: its pipe closed, its process reaped (killed if it lingers)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
            self._proc = None

    async def _watch(self) -> None:
        """The watchdog: an engine not heard from for the heartbeat deadline is hung; it is
        failed (and killed, which the reader then sees as its end)."""
        deadline = self.config.engine_heartbeat_timeout_s
        while not self._closing:
            await asyncio.sleep(min(1.0, deadline / 4))
            silent = time.monotonic() - self._last_heard
            if self.dead_reason is None and silent > deadline:
                self._on_dead(f"engine unresponsive: nothing heard from it for {silent:.1f} s "
                              f"(--engine-heartbeat-timeout {deadline:g})", self._generation)
                if self._proc is not None:
                    self._proc.kill()
