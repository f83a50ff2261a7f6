"""`PcmStream`: text in as it arrives, PCM16 chunks of bounded size out."""

from __future__ import annotations

from collections.abc import Callable


class PcmStream:
    """Incremental synthesis of one response.

    `render(text) -> bytes` synthesises a piece of text; `ready(text) -> int` says how many leading
    characters of the text not yet rendered can be rendered now (the rest waits for more text, e.g.
    the end of a phrase). Every chunk returned is at most `chunk_bytes`; all but the last of a
    response are exactly `chunk_bytes`. Not thread-safe: one owner (the request's task).
    """

    def __init__(self, render: Callable[[str], bytes], ready: Callable[[str], int], chunk_bytes: int):
        self._render = render
        self._ready = ready
        self._chunk_bytes = chunk_bytes
        self._text = ""
        self._pcm = bytearray()

    def feed(self, text: str) -> list[bytes]:
        """Take more text; return the full chunks now available (possibly none)."""
        self._text += text
        cut = self._ready(self._text)
        if cut:
            self._pcm += self._render(self._text[:cut])
            self._text = self._text[cut:]
        return self._take(self._chunk_bytes)

    def flush(self) -> list[bytes]:
        """The text has ended: render what is left; return every remaining chunk (the last may be short)."""
        if self._text:
            self._pcm += self._render(self._text)
            self._text = ""
        return self._take(1)

    def _take(self, at_least: int) -> list[bytes]:
        """Chunks of `chunk_bytes` cut from the front while at least `at_least` bytes remain."""
        chunks = []
        start, end = 0, len(self._pcm)
        while end - start >= at_least:
            chunks.append(bytes(self._pcm[start:start + self._chunk_bytes]))
            start += len(chunks[-1])
        del self._pcm[:start]
        return chunks
