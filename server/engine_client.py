"""`EngineClient`: the API process's requests in the engine: each one's queue of outputs.

It sends ADD and ABORT through an `EngineSupervisor` (`engine`: the engine process or thread,
its reader thread, its restarts) and, on the event loop, turns each STEP the engine reports into
outputs on per-request `asyncio.Queue`s (async streaming end to end, no thread per stream) and
ingests the step's telemetry, in order. It counts what vLLM's admission limits count: unfinished
sequences and the prompt tokens not yet past prefill.

Threads: every piece of state here (`_streams`, telemetry calls) is owned by the event-loop
thread; `add`, `abort`, `release` and `end_requests` are called on it.

When the engine dies or hangs (see `EngineSupervisor`), every in-flight request gets an
`EngineDead` item on its queue, `Telemetry.fail(h, ERROR)` is called for it and the engine's
gauges drop to 0 (`Telemetry.engine_gone`); `engine.dead_reason` says why until a restarted
engine serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from otel_llm import FinishReason
from otel_llm.server import ipc
from otel_llm.server.config import ServerConfig
from otel_llm.server.engine_supervisor import EngineSupervisor

logger = logging.getLogger(__name__)

TERMINAL_REASONS = (int(FinishReason.ERROR), int(FinishReason.ABORT))  # these end every sequence of a request at once


class EngineDead(Exception):
    """The engine process (or thread) is gone; the request cannot complete."""


class ShuttingDown(Exception):
    """The server's shutdown deadline came before the request finished."""


@dataclass(frozen=True)
class Rejected:
    """The engine refused the request (a bad value it found); a 400 for the client."""

    message: str


class EngineClient:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.engine = EngineSupervisor(config, self._on_event, self._on_engine_dead)
        self._loop: asyncio.AbstractEventLoop | None = None
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

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        """Start the engine and block until it is READY. Raises EngineStartError."""
        self.engine.start()

    def attach(self, loop: asyncio.AbstractEventLoop, telemetry) -> None:
        """Deliver outputs on `loop`; step telemetry goes to `telemetry.ingest` (an
        `otel_llm.Telemetry`), in step order."""
        self._loop = loop
        self._tel = telemetry
        self._texts = {} if telemetry.capture_content else None
        self.engine.attach(loop)

    def close(self) -> None:
        """Stop the engine (idempotent; any thread)."""
        self.engine.close()

    @property
    def dead_reason(self) -> str | None:
        """Why no engine serves now (None while one does)."""
        return self.engine.dead_reason

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
            self.engine.send(command)
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
            self.engine.send(ipc.encode_command(ipc.AbortRequest(rid)))
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

    def _on_engine_dead(self, reason: str) -> None:
        """The engine died or hung (the supervisor restarts it): every request in flight ends."""
        logger.error("engine is dead: %s; failing %d in-flight request(s)", reason, len(self._streams))
        self._end_all(EngineDead(reason), FinishReason.ERROR)
        for rid in self._aborting:  # aborted by their clients, the abort never processed: they end here
            self._loop.call_soon(self._fail, rid, FinishReason.ABORT)
        self._aborting.clear()
        self._loop.call_soon(self._tel.engine_gone)  # after the failures: running/waiting/KV read 0


def _still_running(out: ipc.SeqOutput, running: int) -> int:
    """How many sequences of `out`'s request are still running in the engine after `out`."""
    if not out.finished:
        return running
    return 0 if out.finish_reason in TERMINAL_REASONS else running - 1


def _stamp(into: list[int]) -> None:
    """The step's receive time on the frontend's monotonic clock (Telemetry's default clock,
    the clock of `RequestInfo.arrival_ns`)."""
    into.append(time.monotonic_ns())
