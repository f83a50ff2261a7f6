"""RequestInfo's hand-written __init__ against its dataclass fields."""

import copy
import dataclasses
import inspect
import pickle

import pytest

from otel_llm import RequestInfo


def test_init_parameters_are_the_fields_with_their_defaults():
    params = list(inspect.signature(RequestInfo.__init__).parameters.values())[1:]
    fields = dataclasses.fields(RequestInfo)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields]


def test_behaves_as_a_frozen_dataclass():
    info = RequestInfo("r1", 12, "chat", max_tokens=7, temperature=0.5, stop_sequences=("x",))
    assert (info.request_id, info.prompt_tokens, info.operation, info.max_tokens, info.n, info.top_p) == (
        "r1", 12, "chat", 7, 1, None)
    assert info == RequestInfo("r1", 12, "chat", max_tokens=7, temperature=0.5, stop_sequences=("x",))
    assert hash(info) == hash(RequestInfo("r1", 12, "chat", max_tokens=7, temperature=0.5, stop_sequences=("x",)))
    assert info != dataclasses.replace(info, n=2)
    assert dataclasses.replace(info, n=2).n == 2
    assert dataclasses.asdict(info)["stop_sequences"] == ("x",)
    assert "max_tokens=7" in repr(info)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.n = 3
    with pytest.raises(TypeError):
        RequestInfo("r1", 12, "chat", max_token=7)  # a misspelt field is an error, as before


def test_pickles_and_copies_whole():
    """A request's info may cross a process boundary (a multiprocess frontend) or be copied."""
    info = RequestInfo("r1", 12, "chat", trace_headers={"traceparent": "00-ab-cd-01"}, lora_name="a")
    for clone in (pickle.loads(pickle.dumps(info)), copy.copy(info), copy.deepcopy(info)):
        assert clone == info and vars(clone) == vars(info)
