"""`OpenAIServing`: `/v1/completions` and `/v1/chat/completions`.

Per request, on the event-loop thread: validate (400/404 naming the field),
tokenize in this process (a prompt whose length alone shows it cannot fit the
context is refused untokenized: `Tokenizer.floor`), check the admission limits (503, `admission.py`),
`Telemetry.arrival` (its handle is the engine rid), send ADD, then consume the
request's queue (`EngineClient.add`) either into one JSON body or into an SSE
stream (`data: {...}\\n\\n` ... `data: [DONE]\\n\\n`).
Whatever has piled up in the queue is coalesced into one chunk per choice, so a
slow reader costs fewer writes, not more. If the client goes away before the
request finished (stream closed, or the connection dropped while waiting for a
non-streaming body) the request is aborted in the engine. A chat request for audio output is
refused with a 400, unless an `audio` hook makes it (`otel-llm serve-pipeline`'s
`otel_llm.server.pipeline.pipeline_serving.PipelineServing`): it then consumes the engine's outputs.

Size: the OpenAI endpoints' one request path (validate, tokenize, admit, send, stream or collect)
and the helpers they share.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from otel_llm import FinishReason, RequestInfo
from otel_llm.export.redaction import echoed
from otel_llm.server import ipc, protocol
from otel_llm.server.api.admission import Admission
from otel_llm.server.api.errors import OpenAIError, bad_request
from otel_llm.server.engine_client import TERMINAL_REASONS, EngineClient, EngineDead, Rejected, ShuttingDown

logger = logging.getLogger(__name__)
_REASONS = {int(r): r.name.lower() for r in FinishReason}
_INT64 = (-(1 << 63), (1 << 63) - 1)  # what the engine's wire format (server/ipc.py) holds for a seed
_INT32_MAX = (1 << 31) - 1  # ... and for top_k
SSE_DONE = "data: [DONE]\n\n"
# What a client is told when the engine dies; why it died (an exit code, a hang) is for the log only.
ENGINE_STOPPED = "the engine is not running (it stopped; it may be restarting): retry later"
ENGINE_STOPPED_SERVING = "the engine stopped while serving this request: retry it"
# the engine stopped as the request was handed to it: registered, so counted as `error`, unlike ENGINE_STOPPED
ENGINE_LOST_AT_HANDOVER = "the engine stopped as this request was handed to it: retry it"
_INLINE_TOKENIZE_CHARS = 4096  # longer prompts are tokenized off the event loop (~1 ms of tokenizer per 4 KiB)


@dataclass(frozen=True)
class _Prepared:
    """A validated request, ready for the engine (rid not yet allocated)."""

    request_id: str
    operation: str
    prompt_ids: list[int]
    max_tokens: int
    max_tokens_requested: int | None
    n: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    timings: bool = False  # the response carries the request's `timings` (--return-timings or the request's return_timings)


class ClientGone(Exception):
    pass


class OpenAIServing:
    """Handlers for the two generation endpoints; event-loop thread only."""

    def __init__(self, client: EngineClient, telemetry, tokenizer, model_name: str, audio=None):
        """`audio`: what makes audio output (`otel-llm serve-pipeline`'s `PipelineServing`: its
        `serve(prepared, request, batches, audio_output)` answers the request); None: audio is refused."""
        self.client = client
        self.audio = audio
        self.tel = telemetry
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = client.engine.max_model_len
        self.max_num_seqs = client.config.engine.max_num_seqs  # n above it could never run
        self.admission = Admission(client, telemetry, client.config.max_num_queued_reqs,
                                   client.config.max_num_queued_tokens, client.config.admission_status)
        # Engine rids when Telemetry gives no handle (disabled, or its table is full):
        # negative, so they never collide with a handle.
        self._fallback_rids = itertools.count(-2, -1)
        self._floor = tokenizer.floor  # read once here, at startup (it reads the vocabulary)
        # One thread: long prompts are tokenized one at a time, beside the event loop.
        self._tokenize_thread = ThreadPoolExecutor(1, thread_name_prefix="tokenize")

    # -- endpoints ---------------------------------------------------------
    async def completions(self, req: protocol.CompletionRequest, request: Request) -> Response:
        _check_unicode(req)
        self._check(req)
        prompt_ids = await self._completion_prompt(req.prompt)
        p = self._prepare(req, "text_completion", f"cmpl-{uuid.uuid4().hex}", prompt_ids, req.max_tokens)
        prompt = req.prompt if isinstance(req.prompt, str) else self.tokenizer.decode(prompt_ids)
        return await self._serve(p, request, chat=False, content=lambda: [{"role": "user", "content": prompt}])

    async def chat(self, req: protocol.ChatCompletionRequest, request: Request) -> Response:
        _check_unicode(req)
        audio = self._audio_output(req)
        self._check(req, audio_ok=audio is not None)
        if not req.messages:
            raise bad_request("messages must be a non-empty list", "messages")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except ValueError as exc:
            raise bad_request(str(exc), "messages") from None
        prompt_ids = await self._encode(prompt, "messages")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        p = self._prepare(req, "chat", f"chatcmpl-{uuid.uuid4().hex}", prompt_ids, max_tokens, param)
        return await self._serve(p, request, chat=True, content=lambda: messages, audio=audio)

    def _audio_output(self, req: protocol.ChatCompletionRequest) -> protocol.AudioOutput | None:
        """The audio the request asks for (None: text only); a 400 naming the field for a bad one, or for
        any when this server makes no audio."""
        if self.audio is None:
            _refuse_audio_output(req)
            return None
        try:
            audio = protocol.audio_output(req)
        except protocol.InvalidField as exc:
            raise bad_request(str(exc), exc.param) from None
        if audio is not None and req.n != 1:
            raise bad_request(f"n must be 1 with audio output, got {req.n}", "n")
        return audio

    # -- validation --------------------------------------------------------
    def _check(self, req, audio_ok: bool = False) -> None:
        """The model is ours, no field asks for what this server does not do (`audio_ok`: audio output
        is made), and the admission limits let it in for now (vLLM's preflight, before tokenizing)."""
        if req.model != self.model_name:
            raise OpenAIError(404, f"The model `{echoed(req.model)}` does not exist.", "model", "model_not_found")
        unsupported = protocol.unsupported_field(req)
        if unsupported is not None and not (audio_ok and unsupported == "audio"):
            raise bad_request(f"{unsupported} is not supported by this server", unsupported)
        self.admission.check(max(req.n, 1), None)  # checked again in _serve, after the awaits

    async def _encode(self, text: str, param: str) -> list[int]:
        """Token ids; a long text is tokenized on the tokenizer thread (the tokenizer releases
        the GIL), so the event loop keeps streaming meanwhile (10 MB take seconds). A text that is
        more tokens than the context holds by its length alone (`Tokenizer.floor`) is refused first,
        untokenized: a 400 naming `param`."""
        if self._floor is not None and len(text) >= self.max_model_len:
            at_least = self._floor.tokens(text)
            if at_least >= self.max_model_len:
                raise _no_room(self.max_model_len, f"at least {at_least}", param)
        if len(text) <= _INLINE_TOKENIZE_CHARS:
            return self.tokenizer.encode(text)
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_thread, self.tokenizer.encode, text)

    async def _completion_prompt(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return await self._encode(prompt, "prompt")
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if isinstance(prompt[0], int):
            ids = list(prompt)
        elif len(prompt) != 1:
            raise bad_request("batched prompts are not supported: send one prompt per request", "prompt")
        elif isinstance(prompt[0], str):
            return await self._encode(prompt[0], "prompt")
        else:
            ids = list(prompt[0])
        vocab = self.tokenizer.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"token id {bad} is out of range [0, {vocab})", "prompt")
        return ids

    def _prepare(self, req, operation: str, request_id: str, prompt_ids: list[int], max_tokens: int | None,
                 max_tokens_param: str = "max_tokens") -> _Prepared:
        if not prompt_ids:
            raise bad_request("the prompt is empty (0 tokens)", "prompt" if operation != "chat" else "messages")
        if max_tokens is not None and max_tokens < 1:
            raise bad_request(f"{max_tokens_param} must be at least 1, got {max_tokens}", max_tokens_param)
        if req.n < 1:
            raise bad_request(f"n must be at least 1, got {req.n}", "n")
        if req.n > self.max_num_seqs:
            raise bad_request(f"n must be at most {self.max_num_seqs} (the server's max_num_seqs), got {req.n}", "n")
        if req.seed is not None and not _INT64[0] <= req.seed <= _INT64[1]:
            raise bad_request(f"seed must be a 64-bit signed integer, got {req.seed}", "seed")
        temperature = 1.0 if req.temperature is None else req.temperature
        if not temperature >= 0:
            raise bad_request(f"temperature must be >= 0, got {req.temperature}", "temperature")
        top_p = 1.0 if req.top_p is None else req.top_p
        if not 0 < top_p <= 1:
            raise bad_request(f"top_p must be in (0, 1], got {req.top_p}", "top_p")
        top_k = -1 if req.top_k is None else req.top_k
        if not -1 <= top_k <= _INT32_MAX:
            raise bad_request(f"top_k must be -1 (off) or in [0, {_INT32_MAX}], got {req.top_k}", "top_k")
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        if any(not s for s in stop):
            raise bad_request("stop strings must be non-empty", "stop")
        n_prompt, limit = len(prompt_ids), self.max_model_len
        if n_prompt >= limit:
            raise _no_room(limit, str(n_prompt), "messages" if operation == "chat" else "prompt")
        if max_tokens is not None and n_prompt + max_tokens > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} in the completion). "
                f"Please reduce the length of the prompt or {max_tokens_param}.", max_tokens_param)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        timings = self.client.config.return_timings if req.return_timings is None else req.return_timings
        return _Prepared(
            request_id, operation, prompt_ids, max_tokens if max_tokens is not None else limit - n_prompt,
            max_tokens, req.n, temperature, top_p, top_k, req.seed, stop, req.ignore_eos, req.stream, include_usage,
            timings,
        )

    # -- serving -----------------------------------------------------------
    async def _serve(self, p: _Prepared, request: Request, chat: bool, content,
                     audio: protocol.AudioOutput | None = None) -> Response:
        """`content()`: the input messages ({role, content} dicts), built only when content capture is on.
        With `audio`, the engine's outputs go to the `audio` hook, which answers."""
        if self.client.dead_reason is not None:
            raise OpenAIError(503, ENGINE_STOPPED, code="engine_dead")  # why: logged when it stopped
        self.admission.check(p.n, p.request_id)  # no await from here to `client.add`: the counts stay true
        input_messages = _semconv_messages(content()) if self.tel.capture_content else None
        rid = self.tel.arrival(RequestInfo(
            request_id=p.request_id, operation=p.operation, prompt_tokens=len(p.prompt_ids),
            max_tokens=p.max_tokens_requested, n=p.n, temperature=p.temperature, top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else None, seed=p.seed, stream=p.stream, stop_sequences=p.stop,
            trace_headers=getattr(request.state, "trace_headers", None),
            arrival_ns=getattr(request.state, "arrival_ns", None),
            input_messages=input_messages,
        ))
        if rid == -1:
            rid = next(self._fallback_rids)
        request.state.return_timings = p.timings  # the traceresponse header (server.api.tracing)
        if p.timings:
            self.tel.want_timings(rid)
        try:
            queue = self.client.add(ipc.AddRequest(
                rid, p.prompt_ids, p.n, p.temperature, p.top_p, p.top_k, p.seed, p.max_tokens, p.ignore_eos, p.stop,
            ))
        except EngineDead as exc:
            if rid > 0:
                self.tel.fail(rid, FinishReason.ERROR)
            logger.warning("request %s: the engine is not running: %s", p.request_id, exc)
            raise OpenAIError(503, ENGINE_LOST_AT_HANDOVER, code="engine_dead") from None
        except Exception:  # nothing may stay registered: the request is finished as an error, counted
            if rid > 0:
                self.tel.fail(rid, FinishReason.ERROR)
            logger.exception("request %s could not be handed to the engine", p.request_id)
            raise OpenAIError(500, "internal error: the request could not be handed to the engine",
                              code="internal_error") from None
        batches = self._batches(rid, queue, p.n)
        if audio is not None:
            return await self.audio.serve(p, request, batches, audio, self._timings(p, rid))
        if p.stream:
            return StreamingResponse(self._sse(p, batches, chat, self._timings(p, rid)),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            return await until_disconnect(request, self._collect(p, batches, chat, self._timings(p, rid)))
        except ClientGone:
            return Response(status_code=499)

    def _timings(self, p: _Prepared, rid: int):
        """The coroutine function that gives the request's `timings` once its last output was read (None
        when the request did not ask for them)."""
        if not p.timings:
            return None

        async def timings() -> dict | None:
            await asyncio.sleep(0)  # the step that finished it is ingested right after its outputs were handed out
            return self.tel.pop_timings(rid)
        return timings

    async def _batches(self, rid: int, queue: asyncio.Queue, n: int) -> AsyncIterator[list[ipc.SeqOutput]]:
        """Everything queued for `rid` so far, until its `n` sequences finished.
        Aborts the request in the engine if the consumer stops early."""
        remaining = n
        try:
            while remaining:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                for item in batch:
                    if isinstance(item, EngineDead):
                        raise OpenAIError(500, ENGINE_STOPPED_SERVING, code="engine_dead")  # why: logged
                    if isinstance(item, Rejected):
                        raise bad_request(item.message)
                    if isinstance(item, ShuttingDown):
                        raise OpenAIError(503, str(item), code="server_shutting_down")
                    if item.finished:
                        # ERROR/ABORT may come before the request forked its n sequences:
                        # it ends the whole request.
                        remaining = 0 if item.finish_reason in TERMINAL_REASONS else remaining - 1
                yield batch
        finally:
            if remaining:
                self.client.abort(rid, remaining)
                self.tel.pop_timings(rid)  # no response will ask for them
            else:
                self.client.release(rid)

    async def _collect(self, p: _Prepared, batches, chat: bool, timings=None) -> JSONResponse:
        texts = [[] for _ in range(p.n)]
        reasons: list[str | None] = [None] * p.n
        n_out = n_cached = 0
        async for batch in batches:
            for o in batch:
                texts[o.seq_index].append(o.text)
                n_out += len(o.token_ids)
                n_cached = o.num_cached_tokens
                if o.finished:
                    reasons[o.seq_index] = _REASONS.get(o.finish_reason)
        joined = ["".join(t) for t in texts]
        use = protocol.usage(len(p.prompt_ids), n_out, n_cached)
        build = protocol.chat_response if chat else protocol.completion_response
        body = build(p.request_id, int(time.time()), self.model_name, joined, reasons, use)
        if timings is not None:
            body["timings"] = await timings()
        return JSONResponse(body)

    async def _sse(self, p: _Prepared, batches, chat: bool, timings=None) -> AsyncIterator[str]:
        """With `timings`, the final chunk (the usage chunk if asked for, else the last finish) carries them."""
        created, model, with_usage = int(time.time()), self.model_name, p.include_usage
        n_out = n_cached = finished = 0
        try:
            if chat:
                for i in range(p.n):
                    yield sse_event(protocol.chat_chunk(p.request_id, created, model, i,
                                                        {"role": "assistant", "content": ""}, None, with_usage))
            async for batch in batches:
                per_seq: dict[int, list] = {}
                for o in batch:
                    entry = per_seq.setdefault(o.seq_index, [[], None, 0])
                    entry[0].append(o.text)
                    entry[2] += len(o.token_ids)
                    n_out += len(o.token_ids)
                    n_cached = o.num_cached_tokens
                    if o.finished:
                        entry[1] = _REASONS.get(o.finish_reason)
                        finished = p.n if o.finish_reason in TERMINAL_REASONS else finished + 1
                parts = []
                for i, (pieces, reason, tokens) in per_seq.items():
                    text = "".join(pieces)
                    if not (text or tokens or reason):  # like vLLM: a chunk per step with new tokens, even
                        continue  # when they do not complete a character yet (text ""), so TTFT is visible
                    if chat:
                        chunk = protocol.chat_chunk(p.request_id, created, model, i,
                                                    {"content": text} if text or tokens else {}, reason, with_usage)
                    else:
                        chunk = protocol.completion_chunk(p.request_id, created, model, i, text, reason, with_usage)
                    parts.append(chunk)
                if parts and finished >= p.n and timings is not None and not with_usage:
                    parts[-1]["timings"] = await timings()
                if parts:
                    yield "".join(map(sse_event, parts))
            if with_usage:
                obj = "chat.completion.chunk" if chat else "text_completion"
                use = protocol.usage(len(p.prompt_ids), n_out, n_cached)
                chunk = protocol.usage_chunk(p.request_id, created, model, obj, use)
                if timings is not None:
                    chunk["timings"] = await timings()
                yield sse_event(chunk)
        except OpenAIError as exc:
            yield sse_event(exc.body())
        yield SSE_DONE


def _check_unicode(req) -> None:
    """A 400 naming the field of a string UTF-8 cannot encode (the string itself is not echoed)."""
    field = protocol.unencodable_field(req)
    if field is not None:
        raise bad_request(f"{field} is not valid Unicode: it holds a lone UTF-16 surrogate (such as \\ud800), which "
                          "UTF-8 cannot encode", field)


def _no_room(limit: int, prompt_tokens: str, param: str) -> OpenAIError:
    """The prompt alone fills the context (vLLM's words); `prompt_tokens`: its count, or "at least N"."""
    return bad_request(f"This model's maximum context length is {limit} tokens. However, your prompt is "
                       f"{prompt_tokens} tokens, which leaves no room for the completion. Please reduce the "
                       "length of the prompt.", param)


def _refuse_audio_output(req: protocol.ChatCompletionRequest) -> None:
    """A 400 naming the field for a bad `modalities`/`audio`, and for any request for audio output:
    this server makes text only (audio comes from `otel-llm serve-pipeline`)."""
    try:
        modalities = protocol.output_modalities(req)
    except protocol.InvalidField as exc:
        raise bad_request(str(exc), exc.param) from None
    if "audio" in modalities:
        raise bad_request('audio output (modalities with "audio") needs `otel-llm serve-pipeline`: '
                          "`otel-llm serve` generates text only", "modalities")


def sse_event(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def until_disconnect(request: Request, work):
    """Run `work`; if the client disconnects first, cancel it (its cleanup aborts
    the engine request) and raise `ClientGone`."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
    raise ClientGone


def _semconv_messages(messages: list[dict]) -> str:
    """`gen_ai.input.messages`: the GenAI semconv message JSON (role + text parts)."""
    return json.dumps([{"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]} for m in messages])
