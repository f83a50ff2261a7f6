"""Streaming detokenization: token ids in, text deltas out."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

_REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Turns one growing token sequence into text deltas.

    Text is held back while the newest tokens end inside a multi-byte UTF-8
    character (the decode ends in U+FFFD), so no delta ever carries half a
    character; the concatenated deltas plus ``flush()`` equal
    ``decode(all_ids)``. Only a short window of ids is re-decoded per call.
    Not thread-safe: one decoder per stream, owned by one thread.
    """

    def __init__(
        self, decode: Callable[[Sequence[int], bool], str], *, skip_special_tokens: bool = True
    ) -> None:
        self._decode = decode
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the re-decoded window
        self._read_offset = 0  # ids before this have been emitted as text

    @property
    def token_ids(self) -> list[int]:
        """Every id added so far (do not mutate)."""
        return self._ids

    def add(self, token_ids: Iterable[int]) -> str:
        """Append ``token_ids``; return the newly completed text (maybe "")."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset], self._skip)
        full_text = self._decode(self._ids[self._prefix_offset :], self._skip)
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """Return held-back text at end of stream (incomplete bytes become U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset], self._skip)
        full_text = self._decode(self._ids[self._prefix_offset :], self._skip)
        self._prefix_offset = self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]
