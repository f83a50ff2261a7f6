"""Audio output through the real `otel-llm serve`: each bad form is a 400 naming its field, a valid
request is a 400 pointing at `otel-llm serve-pipeline`, and text-only requests are unchanged."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
AUDIO = {"voice": "alloy", "format": "pcm16"}


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)


@pytest.mark.parametrize("modalities", [["text", "audio"], ["audio"]])
def test_audio_output_needs_serve_pipeline(shared_server, modalities):
    with _client(shared_server) as c, pytest.raises(openai.BadRequestError) as exc:
        c.chat.completions.create(model="dummy", messages=MSG, max_tokens=2, modalities=modalities, audio=AUDIO)
    assert exc.value.status_code == 400
    assert exc.value.body["param"] == "modalities"
    assert "otel-llm serve-pipeline" in exc.value.body["message"]


@pytest.mark.parametrize("body,param,contains", [
    ({"modalities": ["text", "video"]}, "modalities", "'video'"),
    ({"modalities": []}, "modalities", "empty"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "mp3"}}, "audio.format", "'pcm16'"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "mp3"}}, "audio.format", "'mp3'"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "bob", "format": "pcm16"}}, "audio.voice", "'bob'"),
    ({"modalities": ["text", "audio"], "audio": {"voice": {"id": "v_1"}, "format": "pcm16"}}, "audio.voice", "v_1"),
    ({"modalities": ["text", "audio"]}, "modalities", "otel-llm serve-pipeline"),  # audio would be needed, too
    ({"modalities": ["text"], "audio": AUDIO}, "audio", "not supported"),  # as before: no audio output asked
])
def test_each_invalid_form_is_a_specific_400(shared_server, body, param, contains):
    r = httpx.post(f"{shared_server.url}{CHAT}", json={"model": "dummy", "messages": MSG, "max_tokens": 2, **body},
                   timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["code"], err["param"]) == ("BadRequestError", 400, param)
    assert contains in err["message"]


def test_an_audio_object_of_the_wrong_shape_is_a_422(shared_server):
    r = httpx.post(f"{shared_server.url}{CHAT}", json={"model": "dummy", "messages": MSG, "modalities": ["audio"],
                                                       "audio": {"voice": "alloy"}}, timeout=30)
    assert r.status_code == 422 and r.json()["error"]["param"] == "audio.format"


@pytest.mark.parametrize("extra", [{}, {"modalities": ["text"]}])
def test_text_only_requests_are_unchanged(shared_server, extra):
    with _client(shared_server) as c:
        r = c.chat.completions.create(model="dummy", messages=MSG, max_tokens=3, extra_body={"ignore_eos": True},
                                      **extra)
        assert r.choices[0].message.audio is None and r.usage.completion_tokens == 3
        chunks = list(c.chat.completions.create(model="dummy", messages=MSG, max_tokens=3, stream=True,
                                                extra_body={"ignore_eos": True}, **extra))
    assert all(ch.choices[0].delta.audio is None for ch in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
