"""The load client: a minimal pooled HTTP/1.1 + SSE client, one task per request, and what each
request looked like from the client (`Result`)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from benchmarks.serving import log
from benchmarks.serving.workload import Req


@dataclass
class Result:
    """One request as the client saw it: perf_counter stamps (CLOCK_MONOTONIC, comparable
    across processes) of the send, of every token chunk, and of the end of the stream."""

    ok: bool = False
    error: str | None = None
    t_send: float = 0.0
    times: list[float] = field(default_factory=list)
    t_end: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


class StreamClient:
    """A minimal HTTP/1.1 client for the load: pooled keep-alive connections, chunked SSE.

    Much cheaper per chunk than a general client (httpx costs ~50-100 us of Python per SSE
    event), so on a 2-core machine the client's own queueing stays out of its TTFT/ITL."""

    def __init__(self, url: str):
        parts = httpx.URL(url)
        self.host, self.port = parts.host, parts.port or 80
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post_sse(self, path: str, body: dict):
        """Yields (perf_counter at receipt, parsed JSON) per `data:` event; raises on non-200."""
        payload = json.dumps(body).encode()
        request = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                   f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
        while True:
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
            reader, writer = conn
            writer.write(request)
            try:
                status_line = await reader.readline()
            except ConnectionError:
                status_line = b""
            if status_line or not reused:
                break
            writer.close()  # the server closed an idle keep-alive connection: retry on another
        reusable = False
        try:
            if not status_line:
                raise ConnectionError("the server closed the connection without answering")
            status = int(status_line.split()[1])
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            if status != 200:
                n = int(headers.get("content-length", "0"))
                raise RuntimeError(f"HTTP {status}: {(await reader.readexactly(n))[:200]!r}")
            buf = b""
            while True:  # Transfer-Encoding: chunked
                line = await reader.readline()
                if not line:
                    raise ConnectionError("the server closed the connection in the middle of the stream")
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    reusable = True
                    return
                buf += (await reader.readexactly(size + 2))[:-2]
                now = time.perf_counter()
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if line.startswith(b"data:"):
                            data = line[5:].strip()
                            if data != b"[DONE]":
                                yield now, json.loads(data)
        finally:
            if reusable:
                self._idle.append(conn)
            else:
                writer.close()

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


AUDIO_OUTPUT = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}


async def one_request(client: StreamClient, model: str, req: Req, ignore_eos: bool, sem: asyncio.Semaphore,
                      audio: bool = False) -> Result:
    """A streamed completion; with `audio`, a streamed chat completion with audio output
    (`otel-llm serve-pipeline`), whose chunks are its audio deltas (TTFT is then time to first packet)."""
    res = Result()
    body = {"model": model, "max_tokens": req.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}
    if audio:
        body.update(messages=[{"role": "user", "content": req.prompt}], **AUDIO_OUTPUT)
    else:
        body["prompt"] = req.prompt
    if ignore_eos:
        body["ignore_eos"] = True
    async with sem:
        res.t_send = time.perf_counter()
        try:
            async for now, chunk in client.post_sse("/v1/chat/completions" if audio else "/v1/completions", body):
                if chunk.get("error"):
                    res.error = str(chunk["error"])[:200]
                    return res
                if audio:
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get("audio", {}).get("data"):
                        res.times.append(now)  # an audio packet
                elif chunk.get("choices"):  # like vLLM's benchmark: a token chunk, even with text "" (the
                    res.times.append(now)  # token does not complete a character yet); the usage chunk has none
                usage = chunk.get("usage")
                if usage:
                    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    res.completion_tokens = int(usage.get("completion_tokens") or 0)
            res.t_end = time.perf_counter()
            res.ok = True
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            res.error = f"{type(exc).__name__}: {exc}"[:200]
    return res


async def run_requests(client: StreamClient, model: str, reqs: list[Req], concurrency: int,
                       ignore_eos: bool, label: str, audio: bool = False) -> tuple[list[Result], float, float]:
    """Runs the workload (`audio`: see `one_request`); (results, start, end) on the perf_counter clock."""
    sem = asyncio.Semaphore(concurrency)
    start = time.perf_counter()
    done = 0

    async def launch(r: Req) -> Result:
        nonlocal done
        delay = start + r.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        out = await one_request(client, model, r, ignore_eos, sem, audio)
        done += 1
        if done % max(1, len(reqs) // 4) == 0 or done == len(reqs):
            log(f"{label}: {done}/{len(reqs)} done")
        return out

    results = await asyncio.gather(*(launch(r) for r in reqs))
    return results, start, time.perf_counter()
