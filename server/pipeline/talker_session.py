"""`TalkerSession`: one request's link from stage 0 to its talker replica, on the event loop.

`send` is the sender side of a transfer hop: it serializes the text delta (tx starts), has the
bytes ready (tx ends) and puts them in the replica's inbox. The replica's `SpeechChunk`s come
back on `outputs`; `received(chunk)` joins the sender's and receiver's timestamps into the hop's
row (size, tx start, tx end, rx start, rx end), kept until `take_hops` hands them over in a batch
(`PipelineRequest.transfers`), and `written` keeps the audio chunks the response wrote, also
handed over in batches (`take_audio`); with `record_hops=False` (stats off) neither is kept. The
inbox put itself (a few microseconds) counts as in flight: tx ends before it, so the receiver can
never start before the sender ended (one monotonic clock, causal order). From its first delta's
put until the replica starts on it (its first chunk) the request waits at the replica: counted in
the replica's `waiting`, and `queued_ns` is when it began (the stage's in-queue time).

Threads: event-loop thread only (the replica puts into `outputs` with `call_soon_threadsafe`).
"""

from __future__ import annotations

import asyncio
import time
from array import array

from otel_llm.server.pipeline.talker import Talker
from otel_llm.server.pipeline.talker_messages import FINAL, SpeechChunk, TextDelta

STAGE_THINKER, STAGE_TALKER = "0", "1"
THINKER_REPLICA = "0"


class TalkerSession:
    def __init__(self, talker: Talker, voice: str, loop: asyncio.AbstractEventLoop, record_hops: bool = True):
        self.replica = talker.pick()
        self.edge = (STAGE_THINKER, THINKER_REPLICA, STAGE_TALKER, self.replica.name)  # of every hop
        self.outputs: asyncio.Queue = asyncio.Queue()  # SpeechChunks, or an exception that ends the request
        self._id = talker.new_session_id()
        self._record = record_hops
        self._sent: dict[int, tuple[int, int]] = {}  # seq -> (tx start ns, tx end ns)
        self._hops = array("q")  # the received hops' rows, flat, until take_hops
        self._audio_ns, self._audio_bytes = array("q"), array("q")  # audio chunks written, until take_audio
        self._audio_started = False
        self._seq = 0
        self._open = True
        self._queued = False  # the first delta is at the replica, which has not started on it
        self.queued_ns = 0  # when the first delta went to the replica
        self.finished = False  # the replica's final chunk came
        put = self.outputs.put_nowait

        def deliver(chunk: SpeechChunk) -> None:  # on the replica thread
            try:
                loop.call_soon_threadsafe(put, chunk)
            except RuntimeError:  # the loop is closed: the server is gone
                pass

        self.replica.open(self._id, voice, deliver)

    def send(self, text: str, final: bool) -> None:
        """One hop: `text` (possibly empty) to the replica; `final` ends the session's text."""
        seq, self._seq = self._seq, self._seq + 1
        tx_start = time.monotonic_ns() if self._record else 0
        data = TextDelta(self._id, seq, text, FINAL if final else 0).encode()
        tx_end = time.monotonic_ns()
        if self._record:
            self._sent[seq] = (tx_start, tx_end)
        if not seq:
            self.queued_ns, self._queued = tx_end, True
            self.replica.waiting += 1
        self.replica.send(data)

    def received(self, chunk: SpeechChunk) -> None:
        """The replica's chunk for one delta came: its hop is complete."""
        self.finished = self.finished or chunk.final
        self._started()
        if self._record:
            tx_start, tx_end = self._sent.pop(chunk.seq)
            self._hops.extend((chunk.size_bytes, tx_start, tx_end, chunk.rx_start_ns, chunk.rx_end_ns))

    def _started(self) -> None:
        """The request no longer waits at the replica (it started on it, or the request is over)."""
        if self._queued:
            self._queued = False
            self.replica.waiting -= 1

    def written(self, sizes: list[int]) -> bool:
        """Audio chunks of `sizes` PCM bytes went out to the client now (kept until `take_audio`).
        True when they hold the response's first audio: hand it over at once (TTFP)."""
        if not self._record or not sizes:
            return False
        self._audio_ns.extend([time.monotonic_ns()] * len(sizes))
        self._audio_bytes.extend(sizes)
        first = not self._audio_started and any(sizes)
        self._audio_started = self._audio_started or first
        return first

    @property
    def num_written(self) -> int:
        """Audio chunks written and not yet taken."""
        return len(self._audio_ns)

    def take_audio(self) -> tuple[array, array]:
        """The written audio chunks since the last call: (last-byte ns, PCM bytes), for
        `PipelineRequest.audio_chunks`."""
        taken = self._audio_ns, self._audio_bytes
        self._audio_ns, self._audio_bytes = array("q"), array("q")
        return taken

    @property
    def num_hops(self) -> int:
        """Hops received and not yet taken."""
        return len(self._hops) // 5

    def take_hops(self) -> array:
        """The received hops' rows since the last call (flat `array('q')`, 5 per hop), for
        `PipelineRequest.transfers(session.edge, rows)`."""
        hops, self._hops = self._hops, array("q")
        return hops

    def close(self) -> None:
        """The request is done with the replica (idempotent); cancelled there if its final chunk had not come."""
        if not self._open:
            return
        self._open = False
        self._started()
        self.replica.active -= 1
        if not self.finished:
            self.replica.cancel(self._id)
