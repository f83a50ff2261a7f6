"""A lone UTF-16 surrogate (JSON's "\\ud800": legal JSON, a legal Python str, not encodable as
UTF-8) anywhere in a request: a 400 naming the field, never a 500, and with tracing on it costs no
other request its spans (an exporter batch holding such a string used to be lost whole)."""

from __future__ import annotations

import httpx
import pytest
from api_server_harness import sample, wait_until

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
U = "\\ud800"  # the six characters of the JSON escape
MSG = '[{"role": "user", "content": "hi"}]'
CASES = [
    (CHAT, f'{{"model": "dummy", "messages": [{{"role": "user", "content": "a{U}b"}}]}}', "messages.0.content"),
    (CHAT, f'{{"model": "dummy", "messages": [{{"role": "user", "content": [{{"type": "text", "text": "{U}"}}]}}]}}',
     "messages.0.content.0.text"),
    (CHAT, f'{{"model": "dummy{U}", "messages": {MSG}}}', "model"),
    (CHAT, f'{{"model": "dummy", "messages": {MSG}, "stop": "{U}"}}', "stop"),
    (CHAT, f'{{"model": "dummy", "messages": {MSG}, "stop": ["ok", "x{U}"]}}', "stop.1"),
    (CHAT, f'{{"model": "dummy", "messages": {MSG}, "user": "{U}"}}', "user"),
    (CMPL, f'{{"model": "dummy", "prompt": "{U}"}}', "prompt"),
    (CMPL, f'{{"model": "dummy{U}", "prompt": "x"}}', "model"),
    (CMPL, f'{{"model": "dummy", "prompt": "x", "logit_bias": {{"{U}": 1}}}}', "logit_bias (one of its keys)"),
]


def _post(server, path: str, raw: str) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=raw.encode(), headers={"content-type": "application/json"},
                      timeout=30)


@pytest.mark.parametrize("path,raw,param", CASES)
def test_a_lone_surrogate_is_a_400_naming_its_field(server, path, raw, param):
    r = _post(server, path, raw)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError"
    assert "lone UTF-16 surrogate" in error["message"]


def test_other_requests_keep_their_spans(sink, server):
    def chats() -> int:
        return sum(1 for s in sink.snapshot() if s.name == "chat dummy")

    before = chats()
    for i in range(20):
        ok = _post(server, CHAT, f'{{"model": "dummy", "messages": [{{"role": "user", "content": "q {i}"}}], '
                                 '"max_tokens": 2}')
        assert ok.status_code == 200, ok.text
        path, raw, _ = CASES[i % len(CASES)]
        assert _post(server, path, raw).status_code == 400
    assert wait_until(lambda: chats() - before == 20, timeout_s=20), chats() - before
    metrics = server.metrics()
    assert "otel_llm_span_characters_replaced_total" in metrics
    assert sample(metrics, "otel_llm_span_characters_replaced_total") == 0  # refused at the API: none got this far
