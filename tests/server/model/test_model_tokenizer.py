"""Tokenizer and IncrementalDecoder, on the dummy byte-level tokenizer."""
import random

import pytest
import tokenizers

from otel_llm.server.model import IncrementalDecoder, Tokenizer
from otel_llm.server.model.dummy import IM_END_ID, IM_START_ID, dummy_tokenizer

TEXTS = ["hello world", "héllo wörld", "日本語のテキスト", "emoji 😀👍🏽 mix", "tabs\tand\nnewlines", ""]


@pytest.fixture(scope="module")
def tok():
    return dummy_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_per_utf8_byte_and_round_trip(tok, text):
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_special_tokens_encode_to_one_id_and_are_skipped(tok):
    ids = tok.encode("a<|im_end|>")
    assert ids == [97, IM_END_ID]
    assert tok.decode(ids) == "a"
    assert tok.decode(ids, skip_special_tokens=False) == "a<|im_end|>"
    assert tok.token_to_id("<|im_start|>") == IM_START_ID


def test_chat_template_renders_chatml(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not tok.apply_chat_template(messages, add_generation_prompt=False).endswith("assistant\n")
    ids = tok.encode(tok.apply_chat_template(messages))
    assert ids[0] == IM_START_ID and ids.count(IM_END_ID) == 2


def test_missing_chat_template_raises(tok):
    bare = Tokenizer(tok.backend, eos_token_ids=(0,), chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_raise_exception_becomes_value_error(tok):
    strict = Tokenizer(tok.backend, eos_token_ids=(0,), chat_template="{{ raise_exception('no system') }}")
    with pytest.raises(ValueError, match="no system"):
        strict.apply_chat_template([])


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_decoding_one_token_at_a_time(tok, text):
    dec = tok.incremental_decoder()
    deltas = [dec.add([i]) for i in tok.encode(text)]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + dec.flush() == text


def test_incremental_decoding_holds_back_split_characters(tok):
    dec = tok.incremental_decoder()
    assert dec.add([0xF0, 0x9F]) == ""  # first half of 😀
    assert dec.add([0x98]) == ""
    assert dec.add([0x80, ord("!")]) == "😀!"
    assert dec.token_ids == [0xF0, 0x9F, 0x98, 0x80, ord("!")]


def test_incremental_decoding_skips_specials_and_flushes_garbage(tok):
    dec = tok.incremental_decoder()
    assert dec.add([ord("o"), ord("k")]) == "ok"
    assert dec.add([IM_END_ID]) == ""
    assert dec.add([0xE6]) == ""  # a lead byte with no continuation
    assert dec.flush() == "\ufffd"
    assert dec.flush() == ""


def test_incremental_decoding_can_keep_specials(tok):
    dec = tok.incremental_decoder(skip_special_tokens=False)
    assert dec.add([ord("a"), IM_END_ID]) == "a<|im_end|>"


def test_incremental_decoder_works_with_any_decode_function():
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    backend.decoder = tokenizers.decoders.Fuse()
    dec = IncrementalDecoder(lambda ids, skip: backend.decode(list(ids), skip_special_tokens=skip))
    assert [dec.add([0]), dec.add([1, 1])] == ["a", "bb"]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024


def test_distinct_prompts_do_not_accumulate_in_memory(tok):
    """The byte tokenizer keeps no per-prompt cache: the BPE model's default one held the last
    10,000 whole prompts (~38 MB here), which the soak benchmark saw as API RSS growth."""
    rng = random.Random(0)
    words = ("soak", "token", "cache", "span", "metric", "engine", "queue")
    tok.encode("warm up")
    before = _rss_mb()
    for _ in range(12_000):
        tok.encode(" ".join(rng.choice(words) for _ in range(rng.randint(10, 30))))
    assert _rss_mb() - before < 8.0
