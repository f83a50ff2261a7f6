"""`EngineClient`: the API process's handle on the engine loop.

It starts the engine (a spawned process, or a thread with `in_process=True`),
sends commands as flat bytes, and runs one background reader thread that
`recv_bytes` the engine's events and hands each STEP to the asyncio loop with a
single `loop.call_soon_threadsafe` per step. On the loop thread the step's
telemetry is ingested (in order) and its outputs are put on per-request
`asyncio.Queue`s: async streaming end to end, no thread per stream.

Threads: the reader thread only receives and decodes; every piece of mutable
state (`_streams`, telemetry calls, `dead_reason`) is owned by the event-loop
thread. `send` may be called from the loop thread only (one writer on the pipe).

If the engine dies (EOF on the pipe, FATAL message) or hangs (nothing heard, not
even a heartbeat, for `engine_heartbeat_timeout_s`: the watchdog kills it), every
in-flight request gets an `EngineDead` item on its queue, `Telemetry.fail(h, ERROR)`
is called for it, the engine's gauges drop to 0 (`Telemetry.engine_gone`) and
`dead_reason` says why (for `/health`). Then the engine is restarted, after a
backoff (0.5 s, doubling, at most 30 s), at most `engine_restarts` times in a row
(an engine that ran for `_STABLE_S` resets the count); past that, or for an
in-process engine (a hung thread cannot be killed), `state` is "dead" for good.

Size: engine supervision and request routing, to be split (issue 30, server slice).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, replace
from typing import Literal

from otel_llm import FinishReason
from otel_llm.server import ipc
from otel_llm.server.config import ServerConfig

logger = logging.getLogger(__name__)

_STABLE_S = 60.0  # an engine that ran this long before dying starts the restart budget and backoff afresh
_MAX_BACKOFF_S = 30.0
TERMINAL_REASONS = (int(FinishReason.ERROR), int(FinishReason.ABORT))  # these end every sequence of a request at once


class EngineDead(Exception):
    """The engine process (or thread) is gone; the request cannot complete."""


class ShuttingDown(Exception):
    """The server's shutdown deadline came before the request finished."""


@dataclass(frozen=True)
class Rejected:
    """The engine refused the request (a bad value it found); a 400 for the client."""

    message: str


class EngineStartError(RuntimeError):
    """The engine did not come up. `config_error`: it rejected a configured value."""

    def __init__(self, message: str, config_error: bool = False):
        super().__init__(message)
        self.config_error = config_error


class EngineClient:
    def __init__(self, config: ServerConfig):
        self.config = config
        self._tel = None
        self._texts: dict[int, list[str]] | None = None  # per request, per sequence: only with content capture
        self._streams: dict[int, asyncio.Queue] = {}
        # Requests that have had no output yet (not past prefill): rid -> their prompt tokens x n,
        # the prefill backlog vLLM's --max-num-queued-tokens counts.
        self._fresh: dict[int, int] = {}
        self._unfinished: dict[int, int] = {}  # rid -> its sequences the engine has not finished
        # Requests aborted by their reader whose end the engine has not reported yet: rid -> their
        # sequences still running in it. If the engine dies first, they are finished here (abort).
        self._aborting: dict[int, int] = {}
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

    # -- lifecycle -------------------------------------------------------
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

    def attach(self, loop: asyncio.AbstractEventLoop, telemetry) -> None:
        """Start the reader thread: outputs are delivered on `loop`, step telemetry
        goes to `telemetry.ingest` (an `otel_llm.Telemetry`), in step order."""
        self._loop = loop
        self._tel = telemetry
        self._texts: dict[int, list[str]] | None = {} if telemetry.capture_content else None
        self._start_reader()
        self._watchdog = loop.create_task(self._watch())

    def _start_reader(self) -> None:
        self._generation += 1
        self._reader = threading.Thread(target=self._read_forever, args=(self._conn, self._proc, self._generation),
                                        name="engine-reader", daemon=True)
        self._reader.start()

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

    # -- requests (event-loop thread) -------------------------------------
    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_queued_seqs(self) -> int:
        """Unfinished sequences (waiting or running; a request with n counts n), as vLLM's
        `--max-num-queued-reqs` counts them: a sequence stops counting when the engine reports it
        finished or its request is aborted or released."""
        return sum(self._unfinished.values())

    @property
    def num_queued_prompt_tokens(self) -> int:
        """Prompt tokens (x n) of the requests with no output yet, as vLLM's `--max-num-queued-tokens`
        counts them: the whole prompt until the first token, however much of it is computed."""
        return sum(self._fresh.values())

    def add(self, request: ipc.AddRequest) -> asyncio.Queue:
        """Send ADD; the returned queue yields `ipc.SeqOutput`s, then maybe a
        `Rejected` or an `EngineDead`. Raises EngineDead if the engine is gone."""
        if self.dead_reason is not None:
            raise EngineDead(self.dead_reason)
        command = ipc.encode_command(request)  # before anything is registered: a failure leaves no trace
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request.rid] = queue
        self._fresh[request.rid] = len(request.prompt_token_ids) * request.n
        self._unfinished[request.rid] = request.n
        try:
            self._conn.send_bytes(command)
        except OSError as exc:
            self._drop(request.rid)
            raise EngineDead(f"cannot reach the engine: {exc}") from exc
        return queue

    def release(self, rid: int) -> None:
        """The request finished on the API side; drop its queue."""
        self._drop(rid)

    def abort(self, rid: int, unfinished: int = 1) -> None:
        """Abort in the engine (client disconnected). Safe for finished requests. `unfinished`:
        the request's sequences whose end its reader has not seen; the request is remembered
        until the engine reports them ended (`_aborting`)."""
        queue = self._drop(rid)
        if queue is None or self.dead_reason is not None:
            return
        while not queue.empty():  # outputs delivered but not read (only SeqOutputs: see _drop's callers)
            unfinished = _still_running(queue.get_nowait(), unfinished)
        if unfinished <= 0:
            return  # the engine has finished it already
        self._aborting[rid] = unfinished
        self._send_abort(rid)

    def _send_abort(self, rid: int) -> bool:
        """ABORT to the engine; False when the pipe is gone."""
        try:
            self._conn.send_bytes(ipc.encode_command(ipc.AbortRequest(rid)))
        except OSError:
            return False
        return True

    def _drop(self, rid: int) -> asyncio.Queue | None:
        """Forget a request on this side: its queue (returned, None if already gone), its
        first-output mark and its captured text."""
        self._fresh.pop(rid, None)
        self._unfinished.pop(rid, None)
        if self._texts is not None:
            self._texts.pop(rid, None)
        return self._streams.pop(rid, None)

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
    def _on_event(self, event) -> None:
        if isinstance(event, ipc.Step):
            # Tokens before telemetry, and first and last tokens before the others: the
            # streams of those outputs are woken first, then the step's receive time is
            # stamped (call_soon keeps that order), then the other streams run, and the
            # step's telemetry is ingested last. So the receive time, which ends TTFT and
            # e2e, is taken once the first/last tokens of this step were handed to their
            # connections, and ingest (span building at finishes) delays no token of the step.
            streams, fresh, later = self._streams, self._fresh, []
            for out in event.outputs:
                queue = streams.get(out.rid)
                if queue is None:
                    if out.finished and out.rid in self._aborting:
                        running = _still_running(out, self._aborting.pop(out.rid))
                        if running > 0:
                            self._aborting[out.rid] = running
                    continue
                if out.finished:
                    running = _still_running(out, self._unfinished.get(out.rid, 0))
                    if running > 0:
                        self._unfinished[out.rid] = running
                    else:
                        self._unfinished.pop(out.rid, None)
                if out.finished or out.rid in fresh:
                    fresh.pop(out.rid, None)
                    queue.put_nowait(out)  # wakes the stream now: it drains whatever else is queued
                else:
                    later.append((queue, out))
            if event.telemetry is not None:
                if self._texts is not None:  # before the streams run: they drop finished requests' texts
                    self._capture(event.outputs)
                received: list[int] = []
                self._loop.call_soon(_stamp, received)
            for queue, out in later:
                queue.put_nowait(out)
            if event.telemetry is not None:
                self._loop.call_soon(self._ingest, event.telemetry, received)
        elif isinstance(event, ipc.Reject):
            queue = self._drop(event.rid)
            self._loop.call_soon(self._fail, event.rid)  # after any telemetry already queued
            if queue is not None:
                queue.put_nowait(Rejected(event.message))

    def _ingest(self, telemetry: bytes, received: list[int]) -> None:
        self._tel.ingest(telemetry, received[0])

    def _capture(self, outputs) -> None:
        """Content capture (opt-in): accumulate each request's text per sequence and hand it
        to telemetry when a sequence finishes, before the step that finishes the request."""
        for out in outputs:
            texts = self._texts.setdefault(out.rid, [])
            texts.extend([""] * (out.seq_index + 1 - len(texts)))
            texts[out.seq_index] += out.text
            if out.finished:
                self._tel.set_output(out.rid, texts)

    def _fail(self, rid: int, reason: FinishReason = FinishReason.ERROR) -> None:
        if self._tel.enabled and rid > 0:  # rid <= 0: not a Telemetry handle (see OpenAIServing)
            self._tel.fail(rid, reason)

    def _end_all(self, item: Exception, reason: FinishReason) -> int:
        """End every in-flight request now: `item` on its queue, finished as `reason` in telemetry.
        Returns how many there were."""
        streams, self._streams = self._streams, {}
        self._fresh.clear()
        self._unfinished.clear()
        for rid, queue in streams.items():
            self._loop.call_soon(self._fail, rid, reason)  # after any telemetry already queued
            queue.put_nowait(item)
        return len(streams)

    def end_requests(self, message: str) -> int:
        """Shutdown's deadline: every in-flight request is aborted in the engine and ends now (an
        error answer or event for its client, `abort` in telemetry). Returns how many there were."""
        if self.dead_reason is None:
            for rid in self._streams:
                if not self._send_abort(rid):
                    break
        return self._end_all(ShuttingDown(message), FinishReason.ABORT)

    def _on_dead(self, reason: str, generation: int) -> None:
        if generation != self._generation or self.dead_reason is not None or self._closing:
            return  # an engine already handled (the watchdog's kill, then its EOF)
        logger.error("engine is dead: %s; failing %d in-flight request(s)", reason, len(self._streams))
        self.dead_reason = reason
        self._end_all(EngineDead(reason), FinishReason.ERROR)
        for rid in self._aborting:  # aborted by their clients, the abort never processed: they end here
            self._loop.call_soon(self._fail, rid, FinishReason.ABORT)
        self._aborting.clear()
        self._loop.call_soon(self._tel.engine_gone)  # after the failures: running/waiting/KV read 0
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


def _still_running(out: ipc.SeqOutput, running: int) -> int:
    """How many sequences of `out`'s request are still running in the engine after `out`."""
    if not out.finished:
        return running
    return 0 if out.finish_reason in TERMINAL_REASONS else running - 1


def _stamp(into: list[int]) -> None:
    """The step's receive time on the frontend's monotonic clock (Telemetry's default clock,
    the clock of `RequestInfo.arrival_ns`)."""
    into.append(time.monotonic_ns())
