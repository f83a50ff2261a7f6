"""What crosses the thread boundary between the stages: `TextDelta` (stage 0 -> a talker replica,
as bytes) and `SpeechChunk` (the replica's answer to one delta, handed back to the event loop).

Wire layout of a `TextDelta` (little-endian): session id u64, sequence number u32, flags u8
(FINAL: the text has ended; CANCEL: drop the session), then the text as UTF-8. The bytes are
what one transfer hop carries (`TransferHop.size_bytes`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_HEADER = struct.Struct("<QIB")
HEADER_BYTES = _HEADER.size
FINAL = 1
CANCEL = 2


@dataclass(frozen=True)
class TextDelta:
    """A piece of stage 0's text for one session (one request on one talker replica)."""

    session_id: int
    seq: int  # 0, 1, ... per session
    text: str
    flags: int = 0

    def encode(self) -> bytes:
        return _HEADER.pack(self.session_id, self.seq, self.flags) + self.text.encode()

    @classmethod
    def decode(cls, data: bytes) -> TextDelta:
        """Raises ValueError on bytes that are not a TextDelta."""
        if len(data) < HEADER_BYTES:
            raise ValueError(f"a text delta needs {HEADER_BYTES} header bytes, got {len(data)}")
        session_id, seq, flags = _HEADER.unpack_from(data)
        return cls(session_id, seq, data[HEADER_BYTES:].decode(), flags)

    @property
    def final(self) -> bool:
        return bool(self.flags & FINAL)

    @property
    def cancelled(self) -> bool:
        return bool(self.flags & CANCEL)


@dataclass(frozen=True)
class SpeechChunk:
    """A talker replica's work on one `TextDelta`: the PCM16 chunks it completed (each at most the
    synthesiser's `chunk_bytes`, possibly none), the text they follow (`transcript`), and its
    timestamps (monotonic ns of the process): receive start and end of the delta's bytes, the
    start of the replica's work on the session (its first delta's receive end) and the end of the
    work on this delta. `final`: the session's last chunk; `error`: why synthesis failed (final too)."""

    seq: int
    pcm: tuple[bytes, ...]
    transcript: str
    size_bytes: int
    rx_start_ns: int
    rx_end_ns: int
    work_start_ns: int
    done_ns: int
    final: bool
    error: str | None = None
