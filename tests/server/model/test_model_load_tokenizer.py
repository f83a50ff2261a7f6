"""load_tokenizer (and the loaders' tokenizer-only paths) give load_model's tokenizer, without weights."""
import pytest
import torch

from otel_llm.server.model import dummy, gguf_loader, hf_loader, load_model, load_tokenizer

from .test_model_gguf_loader import _write_gguf
from .test_model_hf_dir import _hf_config, _random_weights, _write_dir

TEXTS = ["hello world", "héllo wörld 😀", "a<|im_end|>b", "12345 digits", ""]
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}]


def _forbid(monkeypatch, module, name):
    def fail(*args, **kwargs):
        raise AssertionError(f"{module.__name__}.{name} called by a tokenizer-only load")

    monkeypatch.setattr(module, name, fail)


def _assert_same(tok, full):
    assert tok.eos_token_ids == full.eos_token_ids and tok.vocab_size == full.vocab_size
    for text in TEXTS:
        assert tok.encode(text) == full.encode(text), text
    prompt = tok.apply_chat_template(MESSAGES)
    assert prompt == full.apply_chat_template(MESSAGES)
    assert tok.encode(prompt) == full.encode(prompt)


@pytest.mark.parametrize("spec", ["dummy", "null"])
def test_dummy(monkeypatch, spec):
    full = load_model("dummy", dtype="float32").tokenizer
    _forbid(monkeypatch, dummy, "dummy_weights")
    _assert_same(load_tokenizer(spec), full)


def test_hf_dir(monkeypatch, tmp_path):
    cfg = _hf_config()
    path = _write_dir(tmp_path / "tiny-llama", cfg, _random_weights(cfg), shards=2)
    full = load_model(str(path), dtype="float32").tokenizer
    _forbid(monkeypatch, hf_loader, "load_file")
    tok = load_tokenizer(str(path))
    _assert_same(tok, full)
    assert tok.eos_token_ids == (258, 256)


def test_gguf(monkeypatch, tmp_path):
    path = _write_gguf(tmp_path / "d.gguf", load_model("dummy", dtype="float32"))
    full = gguf_loader.load_gguf(path, torch.float32)[2]
    _forbid(monkeypatch, gguf_loader, "_dequantize")
    _assert_same(gguf_loader.load_gguf_tokenizer(path), full)


@pytest.mark.parametrize("spec", ["nope", ""])
def test_bad_spec_raises_naming_it(spec):
    with pytest.raises(ValueError, match=repr(spec)):
        load_tokenizer(spec)
