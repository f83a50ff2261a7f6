"""`TokenFloor`: at least how many tokens a text is, from its length, without tokenizing it.

The server refuses a prompt that cannot fit the context from its length alone (a 3.5 MB prompt is
3.6M tokens and 1 s of tokenizer to find that out otherwise). `token_floor(backend)` finds the most
characters of input one token can stand for, `max_chars_per_token`; a text of `n` characters is
then at least `ceil(n / max_chars_per_token)` tokens. The floor must never be too high, so it is
given only for tokenizers that keep every character of the input (but `dropped`, see below):

    model          BPE in which every character reaches a token: byte fallback (`<0x..>` tokens),
                   an unknown token that is not fused, or byte-level (the ByteLevel pre-tokenizer):
                   a character is dropped only when none of its UTF-8 bytes has a symbol in the
                   vocabulary, so a vocabulary that lacks a few ASCII control bytes (SmolLM2's
                   lacks 6) drops just those characters, which the floor does not count (`dropped`);
    pre-tokenizer  none, or ByteLevel, Metaspace, Digits, UnicodeScripts, Split and Punctuation
                   (which do not remove what they split on), in any Sequence;
    normalizer     none, or Prepend, Lowercase, NFD, NFKD, NFC and NFKC, Replace of a string by a
                   non-empty string, in any Sequence: each may shrink the text by a known factor
                   (NFC composes at most 4 code points into one: the longest canonical
                   decomposition), which multiplies the bound;
    added tokens   none that strips the whitespace beside it (`lstrip`/`rstrip`).

A token of `k` vocabulary symbols stands for at most `k` characters after normalization (a byte-
level symbol is one byte, and a character is at least one), so the bound is the longest token
(vocabulary or added) times the normalizer's factor. Anything else (Whitespace pre-tokenizers,
BERT's normalizer, Strip, SentencePiece's precompiled map, WordPiece, Unigram) has no floor: None.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

_CONTINUATION_BYTES = frozenset(range(0x80, 0xC0))  # in every UTF-8 character of 2 or more bytes
_COMPOSE_FACTOR = 4  # NFC/NFKC: code points composed into one, at most (U+1F82's NFD has 4)
_KEEPING_PRE_TOKENIZERS = frozenset(("ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split", "Punctuation"))


class TokenFloor(NamedTuple):
    max_chars_per_token: int  # the most characters of input one token stands for
    dropped: str = ""  # characters the tokenizer drops (no token at all): not counted

    def tokens(self, text: str) -> int:
        """At least this many tokens in `text` (C-speed passes over it: ~1 ms per MB each)."""
        kept = len(text) - sum(text.count(c) for c in self.dropped)
        return -(-kept // self.max_chars_per_token)


def token_floor(backend) -> TokenFloor | None:
    """The floor of a `tokenizers.Tokenizer`, or None where the tokenizer may drop characters."""
    config = json.loads(backend.to_str())
    factor = _normalizer_factor(config.get("normalizer"))
    pre = _pre_tokenizers(config.get("pre_tokenizer"))
    if factor is None or pre is None:
        return None
    dropped = _dropped_characters(config["model"], pre, backend)
    if dropped is None or (dropped and config.get("normalizer") is not None):
        return None  # (a normalizer could turn kept characters into dropped ones)
    added = config.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        return None
    longest = max([len(t) for t in backend.get_vocab(with_added_tokens=False)] + [len(t["content"]) for t in added])
    return TokenFloor(math.ceil(longest * factor), dropped)


def _normalizer_factor(normalizer: dict | None) -> float | None:
    """How many input characters one normalized character may stand for; None: no bound."""
    if normalizer is None:
        return 1.0
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1.0
        for part in normalizer.get("normalizers", []):
            part_factor = _normalizer_factor(part)
            if part_factor is None:
                return None
            factor *= part_factor
        return factor
    if kind in ("Prepend", "Lowercase", "NFD", "NFKD"):
        return 1.0
    if kind in ("NFC", "NFKC"):
        return float(_COMPOSE_FACTOR)
    if kind == "Replace":
        pattern, content = normalizer.get("pattern", {}).get("String"), normalizer.get("content", "")
        return len(pattern) / len(content) if pattern and content else None
    return None


def _pre_tokenizers(pre: dict | None) -> list[str] | None:
    """The pre-tokenizers' types, flattened; None if one may remove characters."""
    if pre is None:
        return []
    if pre.get("type") == "Sequence":
        kinds: list[str] = []
        for part in pre.get("pretokenizers", []):
            part_kinds = _pre_tokenizers(part)
            if part_kinds is None:
                return None
            kinds += part_kinds
        return kinds
    if pre.get("type") not in _KEEPING_PRE_TOKENIZERS or pre.get("behavior") == "Removed":
        return None
    return [pre["type"]]


def _dropped_characters(model: dict, pre: list[str], backend) -> str | None:
    """The characters the model gives no token ("": none); None if it may drop others too."""
    if model.get("type") != "BPE":
        return None
    if model.get("byte_fallback"):
        return ""
    if "ByteLevel" in pre:
        from tokenizers.pre_tokenizers import ByteLevel

        vocab = backend.get_vocab(with_added_tokens=False)
        byte_of = _byte_level_symbols()
        if set(byte_of) != set(ByteLevel.alphabet()):
            return None  # not the byte map this module knows
        missing = {b for symbol, b in byte_of.items() if symbol not in vocab}
        if missing & _CONTINUATION_BYTES:
            return None  # every character of 2+ bytes has a continuation byte: those must all be there
        return "".join(chr(b) for b in sorted(missing) if b < 0x80)  # a lead byte alone drops no character
    return "" if model.get("unk_token") is not None and not model.get("fuse_unk") else None


def _byte_level_symbols() -> dict[str, int]:
    """ByteLevel's symbol of each byte (GPT-2's `bytes_to_unicode`), as {symbol: byte}."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}
