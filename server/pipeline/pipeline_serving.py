"""`PipelineServing`: a chat request for audio output, through both stages (`otel-llm serve-pipeline`).

`OpenAIServing` validates and tokenizes the request and adds it to the engine (stage 0, the
"thinker"), then hands its outputs here (`serve`). Per request, on the event-loop thread:

1. `PipelineTelemetry.arrival` (with the request's arrival stamp and trace headers), stage 0 starts;
   a `TalkerSession` picks the talker replica (stage 1) the request stays on.
2. The forward task sends every engine output of the request to the replica as one transfer hop
   (`TalkerSession.send`: its text as bytes, even empty; the last one final). So with one token
   per engine step a request makes as many hops as it has completion tokens.
3. The response reads the replica's `SpeechChunk`s (each completes a hop; the stage-1 visit is
   recorded) and writes them: streamed as `delta.audio` chunks (base64 PCM and transcript), then
   the `expires_at` update, the finish chunk, usage if asked for and `[DONE]`; or at once as
   `message.audio`. Each streamed PCM chunk is kept once written (`TalkerSession.written`). The
   session's hops and written chunks go to telemetry `FOLD_HOPS` at a time (`_hand_over`), the
   first audio at once (TTFP), the rest before the request finishes with the engine's reason after
   its last byte went out, or when the client goes away.

A client that goes away (stream closed, or a dropped connection while a non-streamed body is
being made) finishes the request as `abort`: the forward task is cancelled, which aborts the
engine request (`OpenAIServing._batches`), and the talker session is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from otel_llm import FinishReason
from otel_llm.pipeline.request import CLIENT_DISCONNECT, FOLD_HOPS, STAGE_ERROR
from otel_llm.pipeline.telemetry import PipelineTelemetry
from otel_llm.server import protocol
from otel_llm.server.api.errors import OpenAIError
from otel_llm.server.api.serving import SSE_DONE, ClientGone, sse_event, until_disconnect
from otel_llm.server.pipeline.audio_chunks import (
    audio_chat_response, audio_chunk, audio_expiry_chunk, message_audio, new_audio_id,
)
from otel_llm.server.pipeline.talker import Talker
from otel_llm.server.pipeline.talker_session import STAGE_TALKER, STAGE_THINKER, THINKER_REPLICA, TalkerSession

logger = logging.getLogger(__name__)


@dataclass
class _Outcome:
    """What the forward task learnt from the engine (read by the response once it is done)."""

    reason: str = "error"
    completion_tokens: int = 0
    cached_tokens: int = 0
    timings: dict | None = None  # the thinker's `timings`, when the request asked for them


class PipelineServing:
    """The audio hook of `OpenAIServing`; event-loop thread only."""

    def __init__(self, talker: Talker, telemetry: PipelineTelemetry, model_name: str):
        self.talker = talker
        self.tel = telemetry
        self.model_name = model_name

    async def serve(self, p, request: Request, batches: AsyncIterator, audio: protocol.AudioOutput,
                    timings=None) -> Response:
        """Answer `p` (OpenAIServing's prepared request, n == 1) from its engine `batches`; `timings`: the
        coroutine function giving the thinker's `timings` once its outputs are read (None: not asked for)."""
        preq = self.tel.arrival(p.request_id, getattr(request.state, "trace_headers", None), audio=True,
                                arrival_ns=getattr(request.state, "arrival_ns", None))
        preq.stage_started(STAGE_THINKER, THINKER_REPLICA)
        session = TalkerSession(self.talker, audio.voice, asyncio.get_running_loop(), record_hops=self.tel.enabled)
        outcome = _Outcome()
        forward = asyncio.ensure_future(self._forward(batches, session, preq, outcome, timings))
        if p.stream:
            return StreamingResponse(self._stream(p, preq, session, forward, outcome), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            return await until_disconnect(request, self._collect(p, preq, session, forward, outcome))
        except ClientGone:
            return Response(status_code=499)

    async def _forward(self, batches, session: TalkerSession, preq, outcome: _Outcome, timings=None) -> None:
        """Stage 0 -> stage 1: each engine output is one hop. An error ends the session's outputs."""
        try:
            async for batch in batches:
                for o in batch:
                    outcome.completion_tokens += len(o.token_ids)
                    outcome.cached_tokens = o.num_cached_tokens
                    if o.finished:
                        outcome.reason = FinishReason(o.finish_reason).label
                    session.send(o.text, o.finished)
            preq.stage_finished(STAGE_THINKER, THINKER_REPLICA)
            if timings is not None:
                outcome.timings = await timings()
        except OpenAIError as exc:
            session.outputs.put_nowait(exc)
        except Exception:  # the request fails, the server goes on
            logger.exception("request %s: forwarding to the talker failed", preq.request_id)
            session.outputs.put_nowait(OpenAIError(500, "internal error in the pipeline", code="internal_error"))

    async def _speech(self, session: TalkerSession, preq) -> AsyncIterator[list]:
        """The replica's chunks as they come, a list at a time (what has piled up), up to the final one,
        each recorded (its hop, the stage-1 visit). Raises the OpenAIError that ended the request."""
        replica = session.replica.name
        started = False
        while True:
            chunks = [await session.outputs.get()]
            while not session.outputs.empty():
                chunks.append(session.outputs.get_nowait())
            for c in chunks:
                if isinstance(c, OpenAIError):
                    raise c
                session.received(c)
                if not started:
                    preq.stage_started(STAGE_TALKER, replica, c.work_start_ns, session.queued_ns)
                    started = True
                if c.final:
                    preq.stage_finished(STAGE_TALKER, replica, c.done_ns)
                    if c.error is not None:
                        raise OpenAIError(500, f"speech synthesis failed: {c.error}", code="talker_error")
            _hand_over(preq, session, FOLD_HOPS)  # bounded: the rest goes before the finish
            yield chunks
            if chunks[-1].final:
                return

    async def _stream(self, p, preq, session: TalkerSession, forward: asyncio.Future,
                      outcome: _Outcome) -> AsyncIterator[str]:
        rid, created, model, usage_too = p.request_id, int(time.time()), self.model_name, p.include_usage
        replica = session.replica.name
        audio_id: str | None = new_audio_id()  # on the first audio delta only
        failure = CLIENT_DISCONNECT  # until it ends otherwise
        try:
            try:
                yield sse_event(protocol.chat_chunk(rid, created, model, 0, {"role": "assistant"}, None, usage_too))
                async for chunks in self._speech(session, preq):
                    pcm = [b for c in chunks for b in c.pcm]
                    transcript = "".join(c.transcript for c in chunks)
                    events = []
                    for i, piece in enumerate(pcm or ([b""] if transcript else [])):
                        events.append(sse_event(audio_chunk(rid, created, model, 0, audio_id, piece,
                                                            transcript if i == 0 else "", usage_too)))
                        audio_id = None
                    if events:
                        yield "".join(events)
                    if session.written([len(piece) for piece in pcm]):  # sent: the generator resumes then
                        preq.audio_chunks(STAGE_TALKER, replica, *session.take_audio())  # the first audio: TTFP now
                await forward
                tail = [audio_expiry_chunk(rid, created, model, 0, usage_too),
                        protocol.chat_chunk(rid, created, model, 0, {}, outcome.reason, usage_too)]
                if usage_too:
                    tail.append(protocol.usage_chunk(rid, created, model, "chat.completion.chunk",
                                                     self._usage(p, outcome)))
                if p.timings:
                    tail[-1]["timings"] = outcome.timings
                yield "".join(sse_event(c) for c in tail)
                error = None
            except OpenAIError as exc:
                yield sse_event(exc.body())
                error = exc
            yield SSE_DONE
            failure = None
            _hand_over(preq, session)
            if error is None:
                self.tel.stream_completed()
                self._finish(p, preq, outcome)
            else:
                self.tel.stream_aborted("engine_dead" if error.code == "engine_dead" else "error")
                preq.fail(STAGE_ERROR)
        except GeneratorExit:  # the response was closed
            if failure is not None:
                self.tel.stream_aborted("closed")
            raise
        except asyncio.CancelledError:
            if failure is not None:
                self.tel.stream_aborted("cancelled")
            raise
        except Exception:  # not the client's doing: a failure of this stage
            if failure is not None:
                self.tel.stream_aborted("error")
                failure = STAGE_ERROR
            raise
        finally:
            _end(preq, session, forward, failure)

    async def _collect(self, p, preq, session: TalkerSession, forward: asyncio.Future,
                       outcome: _Outcome) -> Response:
        pcm: list[bytes] = []
        transcript: list[str] = []
        failure = CLIENT_DISCONNECT  # until it ends otherwise
        try:
            try:
                async for chunks in self._speech(session, preq):
                    for c in chunks:
                        pcm.extend(c.pcm)
                        transcript.append(c.transcript)
                await forward
            except OpenAIError:
                failure = None
                _hand_over(preq, session)
                preq.fail(STAGE_ERROR)
                raise
            failure = None  # finished by the response once sent
            _hand_over(preq, session)
        finally:
            _end(preq, session, forward, failure)
        created, data = int(time.time()), b"".join(pcm)
        body = audio_chat_response(p.request_id, created, self.model_name,
                                   [message_audio(new_audio_id(), data, "".join(transcript), created)],
                                   [outcome.reason], self._usage(p, outcome))
        if p.timings:
            body["timings"] = outcome.timings

        def sent() -> None:  # the body went out: its PCM as one chunk, then the finish
            preq.audio_chunk(STAGE_TALKER, session.replica.name, len(data))
            self._finish(p, preq, outcome)
        return _AudioResponse(body, sent, preq)

    @staticmethod
    def _finish(p, preq, outcome: _Outcome) -> None:
        """The request completed: the engine's finish reason, and the tokens of the client's usage."""
        preq.finish(outcome.reason, prompt_tokens=len(p.prompt_ids), generation_tokens=outcome.completion_tokens)

    @staticmethod
    def _usage(p, outcome: _Outcome) -> dict:
        return protocol.usage(len(p.prompt_ids), outcome.completion_tokens, outcome.cached_tokens)


class _AudioResponse(JSONResponse):
    """A non-streamed audio response: once its body is sent, `sent()` reports its PCM and finishes the
    request; a send that fails (the client went away) fails it as `client_disconnect`."""

    def __init__(self, body: dict, sent, preq):
        super().__init__(body)
        self._sent, self._preq = sent, preq

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException:
            self._preq.abort()
            raise
        self._sent()


def _hand_over(preq, session: TalkerSession, at_least: int = 1) -> None:
    """The session's hops and written audio chunks not yet observed go to telemetry, each once there
    are `at_least` (in batches of `FOLD_HOPS` while the response runs, and all before it finishes)."""
    if session.num_hops >= at_least:
        preq.transfers(session.edge, session.take_hops())
    if session.num_written >= at_least:
        preq.audio_chunks(STAGE_TALKER, session.replica.name, *session.take_audio())


def _end(preq, session: TalkerSession, forward: asyncio.Future, failure: str | None) -> None:
    """The response is over: a request not finished yet fails with `failure` (None: it was finished);
    the engine request is aborted if still running (cancelling `forward` closes its batches) and the
    talker session closed (cancelled if its last chunk had not come)."""
    if failure is not None:
        _hand_over(preq, session)  # those that came before it ended
        preq.fail(failure)
    forward.cancel()
    session.close()
