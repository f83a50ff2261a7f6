"""`otel-llm serve --api-key` (as vLLM's): the OpenAI API needs `Authorization: Bearer KEY`, else 401
with OpenAI's error JSON, which the `openai` client raises as `AuthenticationError`; `/health`,
`/metrics` and Triton's `/v2` stay open; the key is never logged."""

from __future__ import annotations

import httpx
import openai
import pytest
from api_server_harness import ServerProcess, sample

from otel_llm.cli import build_parser
from otel_llm.server.cli import config_from_args
from otel_llm.server.config import ServerConfig

pytestmark = pytest.mark.slow

KEY = "sk-test-4f0c1e2b9d"


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--api-key", KEY).start()
    yield srv
    srv.stop()


def _client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=30)


def test_the_right_key_is_served(server):
    with _client(server, KEY) as client:
        assert [m.id for m in client.models.list().data] == ["dummy"]
        done = client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=3, extra_body={"ignore_eos": True})
        assert done.usage.completion_tokens == 3


@pytest.mark.parametrize("key", ["sk-wrong", KEY + "x", KEY[:-1]])
def test_a_wrong_key_is_an_authentication_error(server, key):
    with _client(server, key) as client, pytest.raises(openai.AuthenticationError) as raised:
        client.completions.create(model="dummy", prompt="hi", max_tokens=2)
    assert raised.value.status_code == 401
    assert raised.value.body == {"message": "incorrect API key", "type": "AuthenticationError", "param": None,
                                 "code": "invalid_api_key"}
    assert key not in raised.value.response.text


@pytest.mark.parametrize("headers", [{}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}])
def test_no_bearer_key_is_a_401_in_openai_shape(server, headers):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/v1/no-such-path")):
        r = httpx.request(method, f"{server.url}{path}", headers=headers, json={}, timeout=10)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        error = r.json()["error"]
        assert error["type"] == "AuthenticationError" and error["code"] == "invalid_api_key"
        assert "Authorization: Bearer" in error["message"]


def test_health_metrics_and_triton_stay_open(server):
    for path in ("/health", "/metrics", "/v2/health/ready", "/v2/models/stats"):
        assert httpx.get(f"{server.url}{path}", timeout=10).status_code == 200, path
    m = server.metrics()  # refusals are counted as vLLM's http_requests_total counts them
    assert sample(m, "http_requests_total", status="4xx") >= 1


def test_the_key_is_not_logged(server):
    assert KEY not in server.output()
    assert "need the API key" in server.output()


def test_the_key_comes_from_the_flag_or_the_environment():
    parse = build_parser().parse_args
    assert config_from_args(parse(["serve"]), environ={"OTEL_LLM_API_KEY": "from-env"}).api_key == "from-env"
    assert config_from_args(parse(["serve", "--api-key", "flag"]), environ={"OTEL_LLM_API_KEY": "env"}).api_key == "flag"
    assert config_from_args(parse(["serve"]), environ={"OTEL_LLM_API_KEY": ""}).api_key is None
    config = ServerConfig(api_key="s3cret")
    assert "s3cret" not in repr(config)
    for bad in ("", "has space", "tab\t", "caf\u00e9"):
        with pytest.raises(ValueError, match="--api-key") as raised:
            ServerConfig(api_key=bad)
        assert not bad or bad not in str(raised.value)


def test_the_demo_client_sends_the_key_and_says_when_it_is_missing(server, capsys):
    from otel_llm.server.demo import run_demo

    assert run_demo(server.url, requests=2, concurrency=2, max_tokens=2, api_key=KEY) == 0
    assert run_demo(server.url, requests=2, concurrency=2, max_tokens=2) == 1
    assert "asks for an API key: pass --api-key or set OTEL_LLM_API_KEY" in capsys.readouterr().out
