"""`Talker`: stage 1 of the pipeline, N replicas that turn text into speech as the text arrives.

Each `TalkerReplica` is one thread with its own inbox (a `queue.Queue` of `TextDelta` bytes):
it receives a delta (rx), decodes it, feeds the session's `PcmStream` and hands a `SpeechChunk`
back to the session's event loop (`loop.call_soon_threadsafe`). Time a delta spends in the
inbox behind other sessions' work is its transfer's in-flight time.

Threads: the replica thread alone owns the sessions' `PcmStream`s and synthesisers; the
session table (who to deliver to, in which voice) is written by the event loop (`open`,
`cancel`) and read by the replica, under the replica's lock. `Talker.open` and `active`
belong to the event-loop thread. A failure in synthesis ends that session with an error
chunk (logged); the replica keeps serving the others.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

from otel_llm.server.pipeline.pcm_stream import PcmStream
from otel_llm.server.pipeline.synth import Synth, make_synth
from otel_llm.server.pipeline.synth_config import SynthConfig
from otel_llm.server.pipeline.talker_messages import CANCEL, SpeechChunk, TextDelta

logger = logging.getLogger(__name__)

Deliver = Callable[[SpeechChunk], None]
_STOP = b""  # not a TextDelta: ends the replica thread


class TalkerReplica:
    def __init__(self, index: int, backend: str):
        self.name = str(index)  # the `replica` label value
        self.backend = backend
        self.active = 0  # sessions open on this replica (event-loop thread only)
        self.waiting = 0  # ... whose text reached the replica before it started on them (`TalkerSession`)
        self._inbox: queue.Queue[bytes] = queue.Queue()
        self._lock = threading.Lock()
        self._sessions: dict[int, tuple[str, Deliver]] = {}  # session id -> (voice, deliver)
        self._thread = threading.Thread(target=self._run, name=f"talker-{index}", daemon=True)
        self._thread.start()

    def open(self, session_id: int, voice: str, deliver: Deliver) -> None:
        with self._lock:
            self._sessions[session_id] = (voice, deliver)
        self.active += 1

    def send(self, data: bytes) -> None:
        """Submit one encoded `TextDelta` (any thread; never blocks)."""
        self._inbox.put(data)

    def cancel(self, session_id: int) -> None:
        """Nothing more is delivered for the session; the replica drops its state when it gets there."""
        with self._lock:
            self._sessions.pop(session_id, None)
        self._inbox.put(TextDelta(session_id, 0, "", CANCEL).encode())

    def stop(self) -> None:
        self._inbox.put(_STOP)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        synths: dict[str, Synth] = {}
        streams: dict[int, tuple[PcmStream, int]] = {}  # session id -> (stream, work start ns)
        while True:
            data = self._inbox.get()
            rx_start = time.monotonic_ns()
            if data == _STOP:
                return
            try:
                self._receive(data, rx_start, synths, streams)
            except Exception:  # the thread boundary: one bad delta must not stop the replica
                logger.exception("talker replica %s: a text delta was dropped", self.name)

    def _receive(self, data: bytes, rx_start: int, synths: dict, streams: dict) -> None:
        delta = TextDelta.decode(data)
        rx_end = time.monotonic_ns()
        sid = delta.session_id
        if delta.cancelled:
            streams.pop(sid, None)
            return
        with self._lock:
            voice, deliver = self._sessions.get(sid, (None, None))
        if deliver is None:  # cancelled while the delta was in flight
            streams.pop(sid, None)
            return
        if sid not in streams:
            synth = synths.get(voice)
            if synth is None:
                synth = synths[voice] = make_synth(SynthConfig(voice=voice, backend=self.backend))
            streams[sid] = (synth.stream(), rx_end)
        stream, work_start = streams[sid]
        error = None
        try:
            pcm = stream.feed(delta.text)
            if delta.final:
                pcm += stream.flush()
        except Exception as exc:  # a synthesiser failure ends this session only
            logger.exception("talker replica %s: synthesis failed", self.name)
            pcm, error = [], f"{type(exc).__name__}: {exc}"
        final = delta.final or error is not None
        if final:
            del streams[sid]
            with self._lock:
                self._sessions.pop(sid, None)
        deliver(SpeechChunk(delta.seq, tuple(pcm), delta.text, len(data), rx_start, rx_end, work_start,
                            time.monotonic_ns(), final, error))


class Talker:
    """The replicas. A request is sticky: `open` picks the least loaded replica when it arrives
    (ties go round-robin) and all of the request's text goes there."""

    def __init__(self, replicas: int, backend: str):
        """`backend`: one that can run (`PipelineServerConfig` checks it at startup)."""
        self.replicas = tuple(TalkerReplica(i, backend) for i in range(replicas))
        self._session_ids = itertools.count(1)
        self._next = 0  # where the round-robin among equally loaded replicas starts

    def pick(self) -> TalkerReplica:
        n = len(self.replicas)
        start, self._next = self._next, (self._next + 1) % n
        return min((self.replicas[(start + k) % n] for k in range(n)), key=lambda r: r.active)

    def new_session_id(self) -> int:
        return next(self._session_ids)

    def close(self) -> None:
        for replica in self.replicas:
            replica.stop()
