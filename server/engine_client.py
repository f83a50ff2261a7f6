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

If the engine dies (EOF on the pipe, FATAL message), every in-flight request
gets an `EngineDead` item on its queue, `Telemetry.fail(h, ERROR)` is called for
it, and `dead_reason` says why (for `/health`).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, replace

from server import ipc
from server.config import ServerConfig

logger = logging.getLogger(__name__)


class EngineDead(Exception):
    """The engine process (or thread) is gone; the request cannot complete."""


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
        self._fresh: set[int] = set()  # requests that have had no output yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proc = None
        self._thread: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._conn = None
        self._closing = False
        self.dead_reason: str | None = None
        self.model_name = ""
        self.max_model_len = 0
        self.engine_pid = 0

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        """Start the engine and block until it is READY. Raises EngineStartError."""
        cfg = self.config
        ctx = mp.get_context("spawn")
        api_conn, engine_conn = ctx.Pipe(duplex=True)
        engine = replace(cfg.engine, num_threads=cfg.engine_threads)
        if cfg.in_process:
            from server.engine_process import run_engine

            self._thread = threading.Thread(
                target=run_engine, args=(engine_conn, engine, cfg.max_recv_per_iter), name="engine-loop", daemon=True,
            )
            self._thread.start()
        else:
            from server.engine_process import engine_main

            # The EngineConfig (a frozen dataclass) is pickled once, here, into the new process.
            self._proc = ctx.Process(
                target=engine_main, args=(engine_conn, engine, cfg.max_recv_per_iter),
                name="otel-llm-engine", daemon=True,
            )
            self._proc.start()
            engine_conn.close()  # the child's end lives in the child; EOF here means it died
        self._conn = api_conn
        ready = self._wait_ready()
        self.model_name, self.max_model_len, self.engine_pid = ready
        logger.info("engine ready: model %s, max_model_len %d, pid %d (%s)", ready.model_name,
                    ready.max_model_len, ready.pid, "in-process thread" if cfg.in_process else "process")

    def _wait_ready(self) -> ipc.Ready:
        if not self._conn.poll(self.config.engine_start_timeout_s):
            self.close()
            raise EngineStartError(f"engine not ready after {self.config.engine_start_timeout_s} s")
        try:
            event = ipc.decode_event(self._conn.recv_bytes())
        except EOFError:
            self.close()
            code = self._proc.exitcode if self._proc is not None else None
            raise EngineStartError(f"engine exited during startup (exit code {code})") from None
        if isinstance(event, ipc.Fatal):
            self.close()
            raise EngineStartError(event.message, event.config_error)
        if not isinstance(event, ipc.Ready):
            raise EngineStartError(f"unexpected first message from the engine: {event!r}")
        return event

    def attach(self, loop: asyncio.AbstractEventLoop, telemetry) -> None:
        """Start the reader thread: outputs are delivered on `loop`, step telemetry
        goes to `telemetry.ingest` (an `otel_llm.Telemetry`), in step order."""
        self._loop = loop
        self._tel = telemetry
        self._texts: dict[int, list[str]] | None = {} if telemetry.capture_content else None
        self._reader = threading.Thread(target=self._read_forever, name="engine-reader", daemon=True)
        self._reader.start()

    def close(self) -> None:
        """Ask the engine to stop and wait for it briefly (idempotent)."""
        self._closing = True
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

    def add(self, request: ipc.AddRequest) -> asyncio.Queue:
        """Send ADD; the returned queue yields `ipc.SeqOutput`s, then maybe a
        `Rejected` or an `EngineDead`. Raises EngineDead if the engine is gone."""
        if self.dead_reason is not None:
            raise EngineDead(self.dead_reason)
        command = ipc.encode_command(request)  # before anything is registered: a failure leaves no trace
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request.rid] = queue
        self._fresh.add(request.rid)
        try:
            self._conn.send_bytes(command)
        except OSError as exc:
            self._drop(request.rid)
            raise EngineDead(f"cannot reach the engine: {exc}") from exc
        return queue

    def release(self, rid: int) -> None:
        """The request finished on the API side; drop its queue."""
        self._drop(rid)

    def abort(self, rid: int) -> None:
        """Abort in the engine (client disconnected). Safe for finished requests."""
        if self._drop(rid) is None or self.dead_reason is not None:
            return
        try:
            self._conn.send_bytes(ipc.encode_command(ipc.AbortRequest(rid)))
        except OSError:
            pass

    def _drop(self, rid: int) -> asyncio.Queue | None:
        """Forget a request on this side: its queue (returned, None if already gone), its
        first-output mark and its captured text."""
        self._fresh.discard(rid)
        if self._texts is not None:
            self._texts.pop(rid, None)
        return self._streams.pop(rid, None)

    # -- reader thread ---------------------------------------------------
    def _read_forever(self) -> None:
        reason = "engine closed the connection"
        try:
            while True:
                event = ipc.decode_event(self._conn.recv_bytes())
                if isinstance(event, ipc.Fatal):
                    reason = event.message
                    break
                self._loop.call_soon_threadsafe(self._on_event, event)
        except (EOFError, OSError):
            if self._proc is not None:
                self._proc.join(timeout=1)
                reason = f"engine process exited (exit code {self._proc.exitcode})"
        except BaseException:
            logger.exception("engine reader thread failed")
            reason = "engine reader thread failed"
        if not self._closing:
            self._loop.call_soon_threadsafe(self._on_dead, reason)

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
                    continue
                if out.finished or out.rid in fresh:
                    fresh.discard(out.rid)
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

    def _fail(self, rid: int) -> None:
        if self._tel.enabled and rid > 0:  # rid <= 0: not a Telemetry handle (see OpenAIServing)
            from otel_llm import FinishReason

            self._tel.fail(rid, FinishReason.ERROR)

    def _on_dead(self, reason: str) -> None:
        logger.error("engine is dead: %s; failing %d in-flight request(s)", reason, len(self._streams))
        self.dead_reason = reason
        streams, self._streams = self._streams, {}
        self._fresh.clear()
        for rid, queue in streams.items():
            self._loop.call_soon(self._fail, rid)  # after any telemetry already queued
            queue.put_nowait(EngineDead(reason))


def _stamp(into: list[int]) -> None:
    """The step's receive time on the frontend's monotonic clock (Telemetry's default clock,
    the clock of `RequestInfo.arrival_ns`)."""
    into.append(time.monotonic_ns())
