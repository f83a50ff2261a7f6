"""`token_floor`: a text is never fewer tokens than its floor (random texts through the real
tokenizers), and tokenizers that may drop characters get no floor."""

import random
import sys
import unicodedata

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from otel_llm.server.model import load_tokenizer
from otel_llm.server.model.dummy import dummy_tokenizer
from otel_llm.server.model.token_floor import _COMPOSE_FACTOR, TokenFloor, token_floor

PIECES = ["the", " ", "quick", "\n", "é", "e\u0301", "\u1100\u1161\u11a8", "日本", "\x04", "\x00", "<|im_end|>", "1",
          "!!", "\U0001F600", "\u03b7\u0314\u0342\u0345", "    ", "ﬃ", "ｶﾞ"]


def _texts(seed: int = 0, count: int = 60) -> list[str]:
    rng = random.Random(seed)
    texts = ["a" * 5000, " " * 5000, "\x04" * 100 + "a", "".join(chr(rng.randrange(1, 0xD000)) for _ in range(5000))]
    texts += ["".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 600))) for _ in range(count)]
    return texts


def _assert_never_above(backend, floor: TokenFloor) -> None:
    for text in _texts():
        assert floor.tokens(text) <= len(backend.encode(text, add_special_tokens=False).ids), text[:40]


def test_the_dummy_byte_tokenizer():
    tok = dummy_tokenizer()
    assert tok.floor == TokenFloor(len("<|endoftext|>"), "")  # its longest token: a special one
    _assert_never_above(tok.backend, tok.floor)
    assert tok.floor.tokens("x" * 13_000) == 1000


@pytest.mark.slow
def test_smollm2_drops_six_control_characters_which_the_floor_leaves_out():
    tok = load_tokenizer("smollm2")
    assert tok.floor.dropped == "\x04\x06\x13\x14\x16\x1d"
    assert tok.encode("\x04\x06\x13") == []
    assert tok.floor.tokens("\x04" * 1000) == 0
    _assert_never_above(tok.backend, tok.floor)


def _bpe(normalizer=None, pre_tokenizer=None, **model_kwargs) -> Tokenizer:
    """A small SentencePiece-style BPE (byte fallback) over the pieces' characters."""
    alphabet = sorted({c for piece in PIECES for c in piece} | {"▁"})
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab.update({c: 256 + i for i, c in enumerate(alphabet)})
    vocab.update({"<unk>": len(vocab), "th": len(vocab) + 1, "the": len(vocab) + 2, "▁the": len(vocab) + 3})
    merges = [("t", "h"), ("th", "e"), ("▁", "the")]
    backend = Tokenizer(models.BPE(vocab, merges, **{"byte_fallback": True, "unk_token": "<unk>", **model_kwargs}))
    backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteFallback()
    return backend


@pytest.mark.parametrize("normalizer,factor", [
    (None, 1),
    (normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), 1),  # Llama 2's
    (normalizers.NFC(), _COMPOSE_FACTOR),  # Qwen 2's
    (normalizers.NFKC(), _COMPOSE_FACTOR),
    (normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()]), 1),
    (normalizers.Replace("  ", "▁"), 2),
])
def test_normalizers_that_keep_every_character_multiply_the_bound(normalizer, factor):
    backend = _bpe(normalizer)
    floor = token_floor(backend)
    assert floor == TokenFloor(len("<0x00>") * factor, "")
    _assert_never_above(backend, floor)


@pytest.mark.parametrize("pre", [None, pre_tokenizers.Metaspace(), pre_tokenizers.Digits(individual_digits=True),
                                 pre_tokenizers.Sequence([pre_tokenizers.Punctuation(), pre_tokenizers.Metaspace()])])
def test_pre_tokenizers_that_keep_every_character(pre):
    backend = _bpe(pre_tokenizer=pre)
    _assert_never_above(backend, token_floor(backend))


@pytest.mark.parametrize("backend", [
    _bpe(normalizers.Strip()),  # whitespace at the ends, however long, disappears
    _bpe(normalizers.StripAccents()),
    _bpe(normalizers.BertNormalizer()),
    _bpe(normalizers.Replace(" ", "")),
    _bpe(pre_tokenizer=pre_tokenizers.Whitespace()),  # drops the whitespace between words
    _bpe(pre_tokenizer=pre_tokenizers.Split(" ", behavior="removed")),
    _bpe(byte_fallback=False, fuse_unk=True),  # a run of unknown characters is one token
    _bpe(byte_fallback=False, unk_token=None),  # unknown characters vanish
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")),
])
def test_tokenizers_that_may_drop_characters_have_no_floor(backend):
    assert token_floor(backend) is None


def test_an_added_token_that_strips_whitespace_has_no_floor():
    backend = _bpe()
    backend.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    assert token_floor(backend) is None


def test_the_compose_factor_is_the_longest_canonical_decomposition():
    assert max(len(unicodedata.normalize("NFD", chr(c))) for c in range(sys.maxunicode + 1)) == _COMPOSE_FACTOR
