"""`--return-timings` and a request's `return_timings`: the `timings` object on non-streamed responses
and on the final streamed chunk, read by the real `openai` client as extra fields, and the W3C
`traceresponse` header naming the response's exported SERVER span."""

from __future__ import annotations

import openai
import pytest
from api_server_harness import ServerProcess, TraceSink, wait_until

FIELDS = {"queue", "prefill", "ttft", "decode", "tpot", "e2e", "prompt_tokens", "cached_prompt_tokens",
          "completion_tokens", "steps", "preemptions"}


@pytest.fixture(scope="module")
def traced():
    sink = TraceSink()
    server = sink.server("--return-timings")
    try:
        yield server, sink
    finally:
        server.stop()
        sink.shutdown()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


def check(timings: dict, usage) -> None:
    assert set(timings) == FIELDS
    assert timings["prompt_tokens"] == usage.prompt_tokens and timings["completion_tokens"] == usage.completion_tokens
    assert timings["steps"] == usage.completion_tokens  # the dummy model: one token per engine step
    assert 0 < timings["ttft"] <= timings["e2e"] and 0 <= timings["queue"] and 0 < timings["prefill"] <= timings["ttft"]
    assert timings["decode"] <= timings["e2e"] and timings["preemptions"] == 0
    assert timings["tpot"] == pytest.approx(timings["decode"] / (usage.completion_tokens - 1), abs=2e-6)


def test_a_response_tells_its_timings_and_its_trace(traced):
    server, sink = traced
    with client(server) as c:
        raw = c.completions.with_raw_response.create(model="dummy", prompt="hello", max_tokens=5)
    completion = raw.parse()
    check(completion.model_extra["timings"], completion.usage)
    version, trace_id, span_id, flags = raw.headers["traceresponse"].split("-")
    assert (version, flags) == ("00", "01") and len(trace_id) == 32 and len(span_id) == 16
    spans = wait_until(lambda: [s for s in sink.snapshot() if s.span_id.hex() == span_id])
    assert spans and spans[0].trace_id.hex() == trace_id and spans[0].name == "POST /v1/completions"
    e2e = completion.model_extra["timings"]["e2e"]
    assert e2e <= (spans[0].end_time_unix_nano - spans[0].start_time_unix_nano) / 1e9  # inside the HTTP span


@pytest.mark.parametrize("include_usage", [False, True])
def test_the_final_streamed_chunk_carries_them(traced, include_usage):
    server, _ = traced
    with client(server) as c:
        chunks = list(c.chat.completions.create(
            model="dummy", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
            stream_options={"include_usage": include_usage}))
    carrying = [i for i, ch in enumerate(chunks) if (ch.model_extra or {}).get("timings")]
    assert carrying == [len(chunks) - 1]
    final = chunks[-1]
    if include_usage:
        check(final.model_extra["timings"], final.usage)
    else:
        assert final.choices[0].finish_reason is not None
        assert final.model_extra["timings"]["completion_tokens"] == 4


def test_a_request_may_decline_them(traced):
    server, _ = traced
    with client(server) as c:
        raw = c.completions.with_raw_response.create(model="dummy", prompt="hello", max_tokens=3,
                                                     extra_body={"return_timings": False})
    assert "traceresponse" not in raw.headers and "timings" not in (raw.parse().model_extra or {})


def test_off_by_default_and_asked_for_per_request():
    server = ServerProcess().start()
    try:
        with client(server) as c:
            plain = c.completions.create(model="dummy", prompt="hello", max_tokens=3)
            asked = c.completions.create(model="dummy", prompt="hello", max_tokens=3,
                                         extra_body={"return_timings": True})
        assert "timings" not in (plain.model_extra or {})
        check(asked.model_extra["timings"], asked.usage)
    finally:
        server.stop()
