"""PipelineRequest: one request's timeline through a pipeline, turned into observations and spans.

Made by `PipelineTelemetry.arrival`. The orchestrator reports stage visits (each one that ends
observes its stage's generation time; a start may say when the request was enqueued there, for
the stage's in-queue time) and transfer hops, the API server reports audio chunks as it streams
them and the finish, or the failure (`fail`; `abort` when the client goes away). At the finish the
request observes its e2e latency, queue wait (arrival to its first stage's start), finish reason
and tokens and, for an audio response, the simulated listener's figures (`audio_player.simulate`);
a failure counts as finished by `abort` and by its reason in `requests_failed`, and observes
neither latency nor tokens (as vLLM-Omni). Either way it emits its span tree (`spans.py`) from the
same timestamps.

Threads: any; the request's own lock guards its timeline (held briefly, and only the
pipeline's lock is taken inside it). Times are ns of the pipeline's monotonic clock; `now_ns`
arguments default to it. Nothing raises: a call after the finish, or with bad values, is
dropped and counted in the pipeline's `dropped`.
"""

from __future__ import annotations

import logging
import threading
from array import array
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from otel_llm.pipeline.audio_player import PlayerResult, simulate
from otel_llm.pipeline.hop import TransferHop, valid_hop

if TYPE_CHECKING:
    from otel_llm.pipeline.telemetry import PipelineTelemetry

logger = logging.getLogger("otel_llm")

ABORT = "abort"  # vLLM-Omni: failed requests (client disconnects, cancellations, stage errors) finish as `abort`
CLIENT_DISCONNECT, STAGE_ERROR = "client_disconnect", "stage_error"  # failure reasons (families.FAILURE_REASONS)
FOLD_HOPS = 64  # a request's hops observed at once (bounded memory; one lock and 4 bucket searches per batch);
# a sender that batches its own hops (`transfers`) hands them over in batches of this size too


class StageVisit(NamedTuple):
    """A stage replica's work on the request; end_ns is 0 while it runs."""

    stage: str
    replica: str
    start_ns: int
    end_ns: int


class PipelineRequest:
    def __init__(self, pipeline: PipelineTelemetry, request_id: str, arrival_ns: int, identity, audio: bool,
                 live: bool = True):
        self.pipeline = pipeline
        self.request_id = request_id
        self.arrival_ns = arrival_ns
        self.identity = identity  # (trace id, span id, parent, sampled) or None: no span
        self.audio = audio  # an audio response: no PCM at the finish counts as skipped
        self._live = live
        self._lock = threading.Lock()
        self.visits: list[StageVisit] = []
        self.hops: list[TransferHop] = []  # kept for the span tree (with a span only)
        self._pending: list[TransferHop] = []  # not yet observed: folded in batches (`FOLD_HOPS`) and at the finish
        self._chunk_ns = array("q")  # each audio chunk's arrival (ns) ...
        self._chunk_bytes = array("q")  # ... and PCM bytes
        self._audio_at: tuple[str, str] | None = None  # the (stage, replica) streaming audio
        self._ttfp = False
        self.finished: tuple[str, int] | None = None  # (reason, finish ns)
        self.failure: str | None = None  # why it failed (`fail`), None when it completed

    def _now(self, now_ns: int | None) -> int:
        return self.pipeline.clock() if now_ns is None else now_ns

    def _refuse(self) -> bool:
        """True (and counted) when the request no longer takes calls; call under the lock."""
        if self.finished is not None:
            self.pipeline.drop()
            return True
        return False

    def stage_started(self, stage: str, replica: str, now_ns: int | None = None, queued_ns: int | None = None) -> None:
        """A stage replica started on the request (the first one moves it from waiting to running).
        `queued_ns`: when the request was enqueued at the stage (its in-queue time is observed)."""
        if not self._live:
            return
        with self._lock:
            if self._refuse():
                return
            first = not self.visits
            start = self._now(now_ns)
            self.visits.append(StageVisit(stage, replica, start, 0))
            if first:
                self.pipeline.request_started()
        if queued_ns is not None:
            self.pipeline.observe_stage_in_queue(stage, (start - queued_ns) / 1e9)  # a negative one is dropped

    def stage_finished(self, stage: str, replica: str, now_ns: int | None = None) -> None:
        """The stage replica's latest visit ended (dropped when it has none running): its
        generation time is observed."""
        if not self._live:
            return
        with self._lock:
            if self._refuse():
                return
            for i in range(len(self.visits) - 1, -1, -1):
                v = self.visits[i]
                if (v.stage, v.replica) == (stage, replica) and not v.end_ns:
                    v = self.visits[i] = v._replace(end_ns=max(self._now(now_ns), v.start_ns))
                    break
            else:
                self.pipeline.drop()
                return
        self.pipeline.observe_stage_gen_time(stage, (v.end_ns - v.start_ns) / 1e9)

    def transfer(self, hop: TransferHop) -> None:
        """One physical hop of this request between two stage replicas. Checked and observed in
        batches of `FOLD_HOPS` and at the finish (a scrape sees a running request's hops up to the
        last batch); a bad one is dropped then (counted), and never drawn as a span."""
        if not self._live:
            return
        with self._lock:
            if self._refuse():
                return
            if self.identity is not None and valid_hop(hop):
                self.hops.append(hop)
            self._pending.append(hop)
            if len(self._pending) < FOLD_HOPS:
                return
            pending, self._pending = self._pending, []
        self.pipeline.observe_transfers(pending)

    def transfers(self, edge: tuple[str, str, str, str], rows) -> None:
        """Physical hops of this request on one edge (from_stage, from_replica, to_stage,
        to_replica), observed at once: for a sender that batches its hops (one call per batch
        instead of one per token). `rows`: (size_bytes, tx_start_ns, tx_end_ns, rx_start_ns,
        rx_end_ns) per hop, as an [n, 5] integer array or a flat sequence of 5n integers (an
        `array('q')`). Bad hops are dropped (counted) and never drawn as spans; rows that are not
        whole hops drop the batch (counted once)."""
        if not self._live:
            return
        try:
            a = np.asarray(rows, np.int64).reshape(-1, 5)
        except (TypeError, ValueError, OverflowError):
            self.pipeline.drop()
            return
        if not len(a):
            return
        with self._lock:
            if self._refuse():
                return
        kept = self.pipeline.observe_transfer_rows(tuple(edge), a)
        if self.identity is not None and len(kept):
            hops = [TransferHop(*edge, *row) for row in kept.tolist()]
            with self._lock:
                self.hops.extend(hops)

    def audio_chunk(self, stage: str, replica: str, pcm_bytes: int, now_ns: int | None = None) -> None:
        """A streamed audio chunk's last byte went out (or arrived, on the client side). The
        first non-empty one observes TTFP."""
        if self._live:
            self.audio_chunks(stage, replica, (self.pipeline.clock() if now_ns is None else now_ns,), (pcm_bytes,))

    def audio_chunks(self, stage: str, replica: str, times_ns, sizes) -> None:
        """Streamed audio chunks, at once: for a sender that keeps them (`array('q')`s or lists of
        when each one's last byte went out, and its PCM bytes). The first non-empty chunk of the
        request observes TTFP. A chunk with negative bytes or from before the arrival is dropped
        (counted); chunks out of order drop the finish's listener simulation (counted)."""
        if not self._live or not len(times_ns):
            return
        arrival = self.arrival_ns
        if len(times_ns) != len(sizes) or min(sizes) < 0 or min(times_ns) < arrival:
            rows = [(t, b) for t, b in zip(times_ns, sizes) if b >= 0 and t >= arrival]
            self.pipeline.drop(max(len(times_ns), len(sizes)) - len(rows))
            if not rows:
                return
            times_ns, sizes = [t for t, _ in rows], [b for _, b in rows]
        ttfp = None
        with self._lock:
            if self._refuse():
                return
            self._audio_at = (stage, replica)
            self._chunk_ns.extend(times_ns)
            self._chunk_bytes.extend(sizes)
            if not self._ttfp:
                ttfp = next((t for t, b in zip(times_ns, sizes) if b), None)  # the first non-empty chunk
                self._ttfp = ttfp is not None
        if ttfp is not None:
            self.pipeline.observe_audio_ttfp(stage, replica, (ttfp - arrival) / 1e9)

    def abort(self, now_ns: int | None = None) -> None:
        """The client went away: failed as `client_disconnect`."""
        self.fail(CLIENT_DISCONNECT, now_ns)

    def fail(self, reason: str = "unknown", now_ns: int | None = None) -> None:
        """The request ended without completing: `reason` is `client_abort` (cancelled through the
        API), `client_disconnect`, `stage_error` (a stage failed) or `unknown` (also for another)."""
        self._end(ABORT, now_ns, str(reason))

    def finish(self, reason: str = "stop", now_ns: int | None = None, gen_time_s: float | None = None,
               sample_rate: int | None = None, prompt_tokens: int = 0, generation_tokens: int = 0) -> None:
        """The response is complete (its last byte went out). `reason`: vLLM's finish reason
        (stop, length, abort, ...); `prompt_tokens`: the first stage's, `generation_tokens`: every
        stage's (ints >= 0; bad ones are dropped, counted). For an audio response not finished
        by `abort`, the listener simulation runs here: `gen_time_s` is the audio stage's generation
        time for RTF (default: its visits' total, else arrival to the last chunk); `sample_rate`
        overrides the config's."""
        tokens = (prompt_tokens, generation_tokens)
        if not all(type(n) is int and n >= 0 for n in tokens):
            self.pipeline.drop()
            tokens = (0, 0)
        self._end(str(reason), now_ns, None, tokens, gen_time_s, sample_rate)

    def _end(self, reason: str, now_ns: int | None, failure: str | None, tokens=(0, 0), gen_time_s=None,
             sample_rate=None) -> None:
        if not self._live:
            return
        pipeline = self.pipeline
        with self._lock:
            if self._refuse():
                return
            now = max(self._now(now_ns), self.arrival_ns)
            self.finished, self.failure = (reason, now), failure
            pending, self._pending = self._pending, []
            started = bool(self.visits)
            queue_wait_s = (self.visits[0].start_ns - self.arrival_ns) / 1e9 if started else None
            self.visits = [v if v.end_ns else v._replace(end_ns=max(now, v.start_ns)) for v in self.visits]
        pipeline.observe_transfers(pending)
        if failure is not None:
            pipeline.request_failed(started, failure)
        else:
            pipeline.request_finished(started, reason, (now - self.arrival_ns) / 1e9,
                                      None if queue_wait_s is None or queue_wait_s < 0 else queue_wait_s, *tokens)
        if reason != ABORT and (self.audio or self._chunk_ns):
            self._audio_result(gen_time_s, sample_rate)
        tracer = pipeline.tracer
        if tracer is not None and self.identity is not None:
            try:
                tracer.emit(self)
            except Exception:  # telemetry never breaks the request path
                logger.exception("otel_llm: pipeline span failed (dropped) for %s", self.request_id)

    def _audio_result(self, gen_time_s: float | None, sample_rate: int | None) -> None:
        at = self._audio_at or (self.visits[-1][:2] if self.visits else None)
        if at is None:  # no stage to put the skip on
            self.pipeline.drop()
            return
        if gen_time_s is None:
            spent = [v.end_ns - v.start_ns for v in self.visits if (v.stage, v.replica) == at]
            gen_time_s = sum(spent) / 1e9 if spent else None
        config = self.pipeline.config
        try:
            arrival = self.arrival_ns
            chunks = zip([(t - arrival) / 1e9 for t in self._chunk_ns], self._chunk_bytes)
            result: PlayerResult = simulate(chunks, sample_rate or config.sample_rate, gen_time_s=gen_time_s,
                                            sample_width=config.sample_width, channels=config.channels,
                                            thresholds_ms=config.continuity_thresholds_ms)
        except ValueError:
            self.pipeline.drop()
            return
        self.pipeline.observe_audio(at[0], at[1], result)
