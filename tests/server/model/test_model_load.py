"""load_model dispatch, dtype handling and the pinned public surface."""
import pytest
import torch

import otel_llm.server.model
from otel_llm.server.model import LlamaConfig, LoadedModel, load_model
from otel_llm.server.model.config import resolve_dtype


def test_public_surface_is_pinned():
    assert sorted(otel_llm.server.model.__all__) == [
        "IncrementalDecoder",
        "LlamaConfig",
        "LoadedModel",
        "Tokenizer",
        "ensure_smollm2_gguf",
        "load_model",
        "load_tokenizer",
    ]


@pytest.mark.parametrize("spec", ["nope", "", "Dummy", "/definitely/not/here"])
def test_bad_spec_raises_naming_it(spec):
    with pytest.raises(ValueError, match=repr(spec).replace("/", ".")):
        load_model(spec)


def test_file_instead_of_directory_is_rejected(tmp_path):
    file = tmp_path / "model.gguf"
    file.write_bytes(b"")
    with pytest.raises(ValueError, match="model.gguf"):
        load_model(str(file))


def test_bad_dtype_raises_naming_it():
    with pytest.raises(ValueError, match="'float16'"):
        load_model("dummy", dtype="float16")


def test_dtype_names_resolve_and_auto_is_the_engines():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="'auto'"):
        resolve_dtype("auto")
    assert load_model("dummy").config.dtype is torch.float32


def test_loaded_model_and_config_are_frozen():
    m = load_model("dummy", dtype="float32")
    assert isinstance(m, LoadedModel) and isinstance(m.config, LlamaConfig)
    with pytest.raises(AttributeError):
        m.name = "x"
    with pytest.raises(AttributeError):
        m.config.num_layers = 3


def test_config_rejects_bad_gqa_ratio():
    m = load_model("dummy", dtype="float32")
    fields = {f: getattr(m.config, f) for f in m.config.__dataclass_fields__}
    with pytest.raises(ValueError, match="num_kv_heads"):
        LlamaConfig(**{**fields, "num_kv_heads": 3})


def test_null_is_the_dummy_without_weights():
    null, dummy = load_model("null"), load_model("dummy")
    assert null.name == "null" and null.weights is None
    assert null.config == dummy.config
    assert null.tokenizer.encode("héllo") == dummy.tokenizer.encode("héllo")
