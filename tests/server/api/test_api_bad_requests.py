"""Bad input gets OpenAI's error JSON with the right status, and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow


def _post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", timeout=30, **kwargs)


def _assert_error(r: httpx.Response, status: int, param: str | None = None, contains: str = "") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param
    assert contains in err["message"]
    return err


CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path,body,status,param,contains", [
    (CHAT, {"model": "dummy", "messages": []}, 400, "messages", "non-empty"),
    (CHAT, {"model": "dummy", "messages": MSG, "max_tokens": -5}, 400, "max_tokens", "-5"),
    (CHAT, {"model": "dummy", "messages": MSG, "max_completion_tokens": 0}, 400, "max_completion_tokens", "0"),
    (CMPL, {"model": "dummy", "prompt": "x", "max_tokens": -1}, 400, "max_tokens", "-1"),
    (CMPL, {"model": "dummy", "prompt": "x", "temperature": -1}, 400, "temperature", ""),
    (CMPL, {"model": "dummy", "prompt": "x", "top_p": 0}, 400, "top_p", ""),
    (CMPL, {"model": "dummy", "prompt": "x", "n": 0}, 400, "n", ""),
    (CMPL, {"model": "dummy", "prompt": "x", "n": 2**32}, 400, "n", "max_num_seqs"),
    (CMPL, {"model": "dummy", "prompt": "x", "n": 65}, 400, "n", "at most 64"),
    (CMPL, {"model": "dummy", "prompt": "x", "seed": 2**80}, 400, "seed", "64-bit"),
    (CHAT, {"model": "dummy", "messages": MSG, "seed": -2**70}, 400, "seed", "64-bit"),
    (CMPL, {"model": "dummy", "prompt": "x", "top_k": 2**40}, 400, "top_k", str(2**40)),
    (CMPL, {"model": "dummy", "prompt": "x", "max_tokens": 2**80}, 400, "max_tokens", "maximum context length"),
    (CMPL, {"model": "dummy", "prompt": ""}, 400, "prompt", "empty"),
    (CMPL, {"model": "dummy", "prompt": [999999]}, 400, "prompt", "999999"),
    (CMPL, {"model": "dummy", "prompt": "x" * 3000}, 400, "prompt", "maximum context length is 2048"),
    (CMPL, {"model": "dummy", "prompt": "x" * 2000, "max_tokens": 100}, 400, "max_tokens", "2100"),
    (CHAT, {"model": "dummy", "messages": [{"role": "user", "content": "y" * 3000}]}, 400, "messages", "2048"),
    (CHAT, {"model": "nope", "messages": MSG}, 404, "model", "nope"),
    (CMPL, {"model": "nope", "prompt": "x"}, 404, "model", "nope"),
    (CHAT, {"model": "dummy"}, 422, "messages", ""),
    (CHAT, {"model": "dummy", "messages": "not a list"}, 422, None, ""),
    (CMPL, {"model": "dummy", "prompt": "x", "max_tokens": "many"}, 422, "max_tokens", ""),
])
def test_bad_request(shared_server, path, body, status, param, contains):
    _assert_error(_post(shared_server, path, json=body), status, param, contains)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2", "{\"model\": \"dummy\", \"messages\": [}".encode()])
def test_malformed_json_is_422(shared_server, raw):
    r = _post(shared_server, CHAT, content=raw, headers={"content-type": "application/json"})
    assert _assert_error(r, 422)["param"] is None  # not the character offset of the error


def test_a_body_that_is_not_utf8_is_an_openai_400(shared_server):
    r = _post(shared_server, CHAT, content=b'{"model": "dummy", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
              headers={"content-type": "application/json"})
    assert _assert_error(r, 400, contains="UTF-8")["param"] is None


@pytest.mark.parametrize("path,body", [(CHAT, {"messages": MSG}), (CMPL, {"prompt": "x"})])
def test_a_long_model_name_is_echoed_cut_short(shared_server, path, body):
    name = "m" * 1_000_000
    err = _assert_error(_post(shared_server, path, json={"model": name, **body}), 404, "model")
    assert err["message"] == f"The model `{'m' * 100}...` does not exist." and err["code"] == "model_not_found"
    r = httpx.get(f"{shared_server.url}/v1/{'p' * 10_000}", timeout=30)  # an unknown path's 404 too
    assert _assert_error(r, 404)["message"] == f"Not Found: GET /v1/{'p' * 96}..."


@pytest.mark.parametrize("method,path,status", [
    ("GET", CHAT, 405), ("PUT", CHAT, 405), ("DELETE", CMPL, 405), ("POST", "/v1/models", 405),
    ("GET", "/v1/nope", 404), ("POST", "/v1/chat/completion", 404),
])
def test_unknown_paths_and_wrong_methods_are_openai_errors(shared_server, method, path, status):
    r = httpx.request(method, f"{shared_server.url}{path}", timeout=30, json={"model": "dummy", "messages": MSG})
    assert _assert_error(r, status, contains=f"{method} {path}")["code"] == status
    if status == 405:
        assert r.headers["allow"] in ("GET", "POST")


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("endpoint,kwargs", [
    ("chat", {"tools": [TOOL]}),
    ("chat", {"tool_choice": "required"}),
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
    ("chat", {"functions": [TOOL["function"]]}),
    ("chat", {"function_call": {"name": "f"}}),
    ("chat", {"response_format": {"type": "json_object"}}),
    ("chat", {"logprobs": True}),
    ("chat", {"top_logprobs": 2}),
    ("chat", {"logit_bias": {"50": 100}}),
    ("chat", {"presence_penalty": 0.5}),
    ("chat", {"frequency_penalty": -1.0}),
    ("chat", {"modalities": ["text", "audio"]}),
    ("completions", {"logprobs": 0}),
    ("completions", {"echo": True}),
    ("completions", {"best_of": 2}),
    ("completions", {"suffix": "tail"}),
    ("completions", {"logit_bias": {"50": 100}}),
])
def test_fields_this_server_would_ignore_are_400s_naming_them(shared_server, endpoint, kwargs):
    (field,) = kwargs
    with openai.OpenAI(base_url=f"{shared_server.url}/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(openai.BadRequestError) as exc:
            if endpoint == "chat":
                c.chat.completions.create(model="dummy", messages=MSG, max_tokens=2, **kwargs)
            else:
                c.completions.create(model="dummy", prompt="x", max_tokens=2, **kwargs)
    assert exc.value.body["param"] == field and field in exc.value.body["message"]


def test_those_fields_at_values_that_ask_for_nothing_are_fine(shared_server):
    with openai.OpenAI(base_url=f"{shared_server.url}/v1", api_key="x", max_retries=0) as c:
        r = c.chat.completions.create(
            model="dummy", messages=MSG, max_tokens=2, tools=[], tool_choice="none", response_format={"type": "text"},
            logprobs=False, top_logprobs=0, logit_bias={}, presence_penalty=0, frequency_penalty=0.0,
            modalities=["text"], functions=None, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 2
        r = c.completions.create(model="dummy", prompt="x", max_tokens=2, echo=False, best_of=1, suffix=None,
                                 extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 2


def test_openai_client_raises_typed_errors(shared_server):
    with openai.OpenAI(base_url=f"{shared_server.url}/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="gpt-4", messages=MSG)
        with pytest.raises(openai.BadRequestError) as exc:
            c.chat.completions.create(model="dummy", messages=[])
        assert exc.value.body["param"] == "messages"
        # and it keeps serving
        r = c.chat.completions.create(model="dummy", messages=MSG, max_tokens=3, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3


def test_out_of_range_integers_leave_nothing_behind(shared_server):
    """Integers beyond what the engine's wire holds get a 400 naming the field (not a 500), and nothing stays
    registered or counted: in-flight back to 0, request counts unchanged, the server keeps answering."""
    def counted() -> float:
        text = httpx.get(f"{shared_server.url}/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total{"))
    before = counted()
    with openai.OpenAI(base_url=f"{shared_server.url}/v1", api_key="x", max_retries=0) as c:
        for i, extra in enumerate(({"seed": 2**80}, {"seed": -2**70}, {"top_k": 2**40}, {"n": 2**32}) * 25):
            field = next(iter(extra))
            kwargs = {"extra_body": extra} if field == "top_k" else extra
            with pytest.raises(openai.BadRequestError) as exc:
                c.completions.create(model="dummy", prompt=f"q{i}", max_tokens=2, **kwargs)
            assert exc.value.body["param"] == field
        r = c.completions.create(model="dummy", prompt="ok", max_tokens=2, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 2
    assert shared_server.health().json()["in_flight"] == 0
    assert counted() == before + 1


def test_still_serving_after_bad_requests(shared_server):
    for body in ({"model": "dummy", "messages": []}, {"model": "dummy", "prompt": "x" * 5000}):
        _post(shared_server, CHAT if "messages" in body else CMPL, json=body)
    r = _post(shared_server, CMPL, json={"model": "dummy", "prompt": "ok", "max_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert shared_server.health().status_code == 200
