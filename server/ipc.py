"""The wire format between the API process and the engine process.

Every message is one flat `bytes` object sent with `Connection.send_bytes` and read
with `recv_bytes`: a `struct` header, then `array('i')` token ids and utf-8 text.
Nothing is pickled; the engine's telemetry record rides along opaque. The first
byte of every message is its kind. Little endian throughout.

API -> engine (commands)
    ADD       `_ADD` header, prompt ids i32[n_prompt], stop token ids i32[n_stop_ids],
              stop string lengths i32[n_stop], stop strings utf-8 (concatenated)
    ABORT     kind u8, rid i64
    SHUTDOWN  kind u8

engine -> API (events)
    READY     kind u8, max_model_len i32, pid i32, model name utf-8
    STEP      `_STEP` header (n outputs, token/text/telemetry byte counts), then columns
              rid i64[n], seq_index i32[n], num_new_tokens i32[n], text_len i32[n],
              num_prompt_tokens i32[n], num_cached_tokens i32[n], finished u8[n],
              finish_reason i8[n] (-1: none), token ids i32[sum num_new_tokens],
              text utf-8, telemetry bytes
    REJECT    kind u8, rid i64, message utf-8 (the engine refused an ADD)
    FATAL     kind u8, config_error u8, message utf-8 (the engine failed to start or its
              loop died; the process exits. config_error: a ValueError at startup)
    HEARTBEAT kind u8 (the loop is alive: sent when it sent nothing else for a second)
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass
from typing import NamedTuple, Union

ADD, ABORT, SHUTDOWN = 1, 2, 3
READY, STEP, REJECT, FATAL, HEARTBEAT = 10, 11, 12, 13, 14

_KIND = struct.Struct("<B")
_ADD = struct.Struct("<BqIIddiqBiBII")
_RID = struct.Struct("<Bq")
_READY = struct.Struct("<Bii")
_STEP = struct.Struct("<BIIII")
_LITTLE = sys.byteorder == "little"


def _pack(code: str, values) -> bytes:
    a = array(code, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _ints(values) -> bytes:
    return _pack("i", values)


def _take_ints(data: memoryview, off: int, n: int, code: str = "i") -> tuple[array, int]:
    a = array(code)
    end = off + n * a.itemsize
    a.frombytes(data[off:end])
    if not _LITTLE:
        a.byteswap()
    return a, end


@dataclass(frozen=True)
class AddRequest:
    """Add one request to the engine. `max_tokens` None: up to the context length."""

    rid: int
    prompt_token_ids: tuple[int, ...] | array
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


class AbortRequest(NamedTuple):
    rid: int


class Shutdown(NamedTuple):
    pass


Command = Union[AddRequest, AbortRequest, Shutdown]


def encode_command(cmd: Command) -> bytes:
    if isinstance(cmd, AddRequest):
        stops = [s.encode() for s in cmd.stop]
        header = _ADD.pack(
            ADD, cmd.rid, len(cmd.prompt_token_ids), cmd.n, cmd.temperature, cmd.top_p, cmd.top_k,
            cmd.seed if cmd.seed is not None else 0, cmd.seed is not None,
            cmd.max_tokens if cmd.max_tokens is not None else -1, cmd.ignore_eos,
            len(cmd.stop_token_ids), len(stops),
        )
        return b"".join((header, _ints(cmd.prompt_token_ids), _ints(cmd.stop_token_ids),
                         _ints(len(s) for s in stops), *stops))
    if isinstance(cmd, AbortRequest):
        return _RID.pack(ABORT, cmd.rid)
    if isinstance(cmd, Shutdown):
        return _KIND.pack(SHUTDOWN)
    raise TypeError(f"not a command: {cmd!r}")


def decode_command(data: bytes) -> Command:
    """Raises ValueError on an unknown kind."""
    kind = data[0]
    if kind == ADD:
        (_, rid, n_prompt, n, temperature, top_p, top_k, seed, has_seed, max_tokens, ignore_eos,
         n_stop_ids, n_stop) = _ADD.unpack_from(data, 0)
        view = memoryview(data)
        prompt, off = _take_ints(view, _ADD.size, n_prompt)
        stop_ids, off = _take_ints(view, off, n_stop_ids)
        lengths, off = _take_ints(view, off, n_stop)
        stops = []
        for length in lengths:
            stops.append(bytes(view[off:off + length]).decode())
            off += length
        return AddRequest(rid, prompt, n, temperature, top_p, top_k, seed if has_seed else None,
                          max_tokens if max_tokens >= 0 else None, bool(ignore_eos), tuple(stops), tuple(stop_ids))
    if kind == ABORT:
        return AbortRequest(_RID.unpack_from(data, 0)[1])
    if kind == SHUTDOWN:
        return Shutdown()
    raise ValueError(f"unknown command kind {kind}")


class Ready(NamedTuple):
    model_name: str
    max_model_len: int
    pid: int


class SeqOutput(NamedTuple):
    """One sequence's new tokens from one engine step. `finish_reason` is the
    `otel_llm.FinishReason` value, or -1 while unfinished."""

    rid: int
    seq_index: int
    token_ids: array
    text: str
    finished: bool
    finish_reason: int
    num_prompt_tokens: int
    num_cached_tokens: int


class Step(NamedTuple):
    outputs: list[SeqOutput]
    telemetry: bytes | None


class Reject(NamedTuple):
    rid: int
    message: str


class Fatal(NamedTuple):
    message: str
    config_error: bool = False


class Heartbeat(NamedTuple):
    pass


Event = Union[Ready, Step, Reject, Fatal, Heartbeat]
HEARTBEAT_BYTES = bytes((HEARTBEAT,))


def encode_ready(model_name: str, max_model_len: int, pid: int) -> bytes:
    return _READY.pack(READY, max_model_len, pid) + model_name.encode()


def encode_reject(rid: int, message: str) -> bytes:
    return _RID.pack(REJECT, rid) + message.encode()


def encode_fatal(message: str, config_error: bool = False) -> bytes:
    return _KIND.pack(FATAL) + bytes((config_error,)) + message.encode()


def encode_step(outputs, telemetry: bytes | None) -> bytes:
    """`outputs`: engine `RequestOutput`s (rid, seq_index, new_token_ids, text_delta,
    finished, finish_reason, num_prompt_tokens, num_cached_tokens)."""
    texts = [o.text_delta.encode() for o in outputs]
    tokens = array("i")
    for o in outputs:
        tokens.extend(o.new_token_ids)
    n_tokens = len(tokens)
    if not _LITTLE:
        tokens.byteswap()
    text = b"".join(texts)
    tel = telemetry or b""
    header = _STEP.pack(STEP, len(outputs), n_tokens, len(text), len(tel) if telemetry is not None else 0xFFFFFFFF)
    return b"".join((
        header,
        _pack("q", [o.rid for o in outputs]),
        _ints(o.seq_index for o in outputs),
        _ints(len(o.new_token_ids) for o in outputs),
        _ints(len(t) for t in texts),
        _ints(o.num_prompt_tokens for o in outputs),
        _ints(o.num_cached_tokens for o in outputs),
        bytes(bool(o.finished) for o in outputs),
        array("b", [-1 if o.finish_reason is None else int(o.finish_reason) for o in outputs]).tobytes(),
        tokens.tobytes(),
        text,
        tel,
    ))


def decode_event(data: bytes) -> Event:
    """Raises ValueError on an unknown kind."""
    kind = data[0]
    if kind == STEP:
        return _decode_step(data)
    if kind == READY:
        _, max_model_len, pid = _READY.unpack_from(data, 0)
        return Ready(data[_READY.size:].decode(), max_model_len, pid)
    if kind == REJECT:
        return Reject(_RID.unpack_from(data, 0)[1], data[_RID.size:].decode())
    if kind == FATAL:
        return Fatal(data[_KIND.size + 1:].decode(), bool(data[_KIND.size]))
    if kind == HEARTBEAT:
        return Heartbeat()
    raise ValueError(f"unknown event kind {kind}")


def _decode_step(data: bytes) -> Step:
    _, n, n_tokens, n_text, n_tel = _STEP.unpack_from(data, 0)
    view = memoryview(data)
    rids, off = _take_ints(view, _STEP.size, n, "q")
    seq, off = _take_ints(view, off, n)
    n_new, off = _take_ints(view, off, n)
    text_len, off = _take_ints(view, off, n)
    n_prompt, off = _take_ints(view, off, n)
    n_cached, off = _take_ints(view, off, n)
    finished = bytes(view[off:off + n])
    off += n
    reasons = array("b", bytes(view[off:off + n]))
    off += n
    tokens, off = _take_ints(view, off, n_tokens)
    text = bytes(view[off:off + n_text])
    off += n_text
    telemetry = None if n_tel == 0xFFFFFFFF else bytes(view[off:off + n_tel])
    outputs = []
    t_off = x_off = 0
    for i in range(n):
        outputs.append(SeqOutput(
            rids[i], seq[i], tokens[t_off:t_off + n_new[i]], text[x_off:x_off + text_len[i]].decode(),
            bool(finished[i]), reasons[i], n_prompt[i], n_cached[i],
        ))
        t_off += n_new[i]
        x_off += text_len[i]
    return Step(outputs, telemetry)
