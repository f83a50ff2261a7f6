"""After a known workload the server's own telemetry agrees with what the client saw:
`/metrics` counts, Triton statistics, and OTLP traces (HTTP SERVER span -> gen_ai span)."""

from __future__ import annotations

import httpx
import openai
import pytest
from api_server_harness import sample, wait_until

pytestmark = pytest.mark.slow

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN_ID = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def workload(server):
    """A known workload; returns (usages, finish reasons) as the client saw them."""
    usages, reasons = [], []
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
        for i in range(3):
            r = c.completions.create(model="dummy", prompt=f"prompt {i}", max_tokens=4 + i,
                                     extra_body={"ignore_eos": True})
            usages.append(r.usage)
            reasons += [ch.finish_reason for ch in r.choices]
        for i in range(2):
            chunks = list(c.chat.completions.create(
                model="dummy", messages=[{"role": "user", "content": f"chat {i}"}], max_tokens=6, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
            usages.append(chunks[-1].usage)
            reasons += [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        r = c.completions.create(model="dummy", prompt="two of them", max_tokens=3, n=2,
                                 extra_body={"ignore_eos": True})
        usages.append(r.usage)
        reasons.append(r.choices[0].finish_reason)  # one request, one finish reason
        base = c.completions.create(model="dummy", prompt="stop here", max_tokens=20, temperature=0,
                                    extra_body={"ignore_eos": True})
        usages.append(base.usage)
        reasons.append(base.choices[0].finish_reason)
        text = base.choices[0].text
        stop = next((text[i:i + 1] for i in range(3, len(text)) if text[i].isalnum()), None)
        if stop is not None:
            r = c.completions.create(model="dummy", prompt="stop here", max_tokens=20, temperature=0, stop=stop,
                                     extra_body={"ignore_eos": True})
            usages.append(r.usage)
            reasons.append(r.choices[0].finish_reason)
        r = httpx.post(f"{server.url}/v1/completions", timeout=30,
                       headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"},
                       json={"model": "dummy", "prompt": "traced", "max_tokens": 2, "ignore_eos": True})
        usages.append(openai.types.CompletionUsage(**{k: r.json()["usage"][k] for k in
                                                      ("prompt_tokens", "completion_tokens", "total_tokens")}))
        reasons.append(r.json()["choices"][0]["finish_reason"])
    return usages, reasons


def test_metrics_match_the_client(server, workload):
    usages, reasons = workload
    assert {"stop", "length"} <= set(reasons)
    n = len(usages)
    m = wait_until(lambda: (lambda m: m if sample(m, "vllm:request_success_total") == n else None)(server.metrics()))
    assert m, f"request_success_total never reached {n}"
    for reason in ("stop", "length", "abort", "error"):
        assert sample(m, "vllm:request_success_total", finished_reason=reason, model_name="dummy") == \
            reasons.count(reason), reason
    assert sample(m, "vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert sample(m, "vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert sample(m, "vllm:e2e_request_latency_seconds_count") == n
    assert sample(m, "vllm:time_to_first_token_seconds_count") == n
    assert sample(m, "vllm:num_requests_running") == 0


def test_triton_statistics(server, workload):
    usages, _ = workload
    r = httpx.get(f"{server.url}/v2/models/dummy/stats", timeout=10)
    assert r.status_code == 200
    (stat,) = r.json()["model_stats"]
    assert stat["name"] == "dummy"
    assert stat["inference_count"] == len(usages)
    assert stat["inference_stats"]["success"]["count"] == len(usages)
    assert httpx.get(f"{server.url}/v2/models/stats", timeout=10).json()["model_stats"][0]["name"] == "dummy"
    assert httpx.get(f"{server.url}/v2/models/dummy/versions/1/stats", timeout=10).status_code == 200
    for path in ("/v2/models/nope/stats", "/v2/models/nope/versions/1/stats", "/v2/models/dummy/versions/7/stats"):
        r = httpx.get(f"{server.url}{path}", timeout=10)
        assert r.status_code == 400
        assert isinstance(r.json()["error"], str) and set(r.json()) == {"error"}


def test_v2_metadata_and_health(server):
    meta = httpx.get(f"{server.url}/v2", timeout=10).json()
    assert "statistics" in meta["extensions"]
    assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{server.url}/v2/models/dummy/ready").status_code == 200
    assert httpx.get(f"{server.url}/v2/models/nope/ready").status_code == 400
    assert server.health().json()["otlp_traces_endpoint"].startswith("http://127.0.0.1:")


def test_metrics_content_negotiation(server):
    text = httpx.get(f"{server.url}/metrics", timeout=10)
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    om = httpx.get(f"{server.url}/metrics", timeout=10, headers={"Accept": "application/openmetrics-text"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")


def test_traces_nest_under_the_http_span(server, sink, workload):
    def find():
        spans = sink.snapshot()
        http = [s for s in spans if s.trace_id.hex() == TRACE_ID and s.parent_span_id.hex() == PARENT_SPAN_ID]
        if not http:
            return None
        children = [s for s in spans if s.parent_span_id == http[0].span_id]
        return (http[0], children) if children else None

    found = wait_until(find, timeout_s=15)
    assert found, f"no traced spans among {[s.name for s in sink.snapshot()]}"
    http, children = found
    assert http.kind == http.SPAN_KIND_SERVER
    assert http.name == "POST /v1/completions"
    attrs = {a.key: a.value for a in http.attributes}
    assert attrs["http.response.status_code"].int_value == 200
    gen_ai = [c for c in children if c.name.startswith("text_completion")]
    assert gen_ai, [c.name for c in children]
    ga = {a.key: a.value for a in gen_ai[0].attributes}
    assert ga["gen_ai.usage.output_tokens"].int_value == 2
    assert "gen_ai.input.messages" not in ga and "gen_ai.output.messages" not in ga  # content is opt-in
    # untraced requests still produce their own traces (a new trace id each)
    assert len({s.trace_id for s in sink.snapshot()}) > 1


def test_content_capture_records_prompt_and_every_choice(sink):
    """With OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT the gen_ai span carries the
    messages and the text of each of the n choices, exactly as the client received them."""
    import json

    srv = sink.server(env={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})
    try:
        with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
            r = c.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "capture me"}],
                                          max_tokens=5, n=2, extra_body={"ignore_eos": True})
            texts = [ch.message.content for ch in sorted(r.choices, key=lambda ch: ch.index)]
            completion = c.completions.create(model="dummy", prompt="plain prompt", max_tokens=3,
                                              extra_body={"ignore_eos": True}).choices[0].text
    finally:
        srv.stop()

    def attrs_of(name_prefix, marker):
        for s in sink.snapshot():
            a = {x.key: x.value.string_value for x in s.attributes}
            if s.name.startswith(name_prefix) and marker in a.get("gen_ai.input.messages", ""):
                return a
        return None

    chat = wait_until(lambda: attrs_of("chat", "capture me"), timeout_s=15)
    assert chat, "no chat span with captured content"
    assert json.loads(chat["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "capture me"}]}]
    out = json.loads(chat["gen_ai.output.messages"])
    assert [m["parts"][0]["content"] for m in out] == texts and {m["finish_reason"] for m in out} == {"length"}
    plain = wait_until(lambda: attrs_of("text_completion", "plain prompt"), timeout_s=15)
    assert plain and json.loads(plain["gen_ai.output.messages"])[0]["parts"][0]["content"] == completion


def _gen_ai_attrs(sink, request_id: str):
    for s in sink.snapshot():
        a = {x.key: x.value for x in s.attributes}
        if "gen_ai.request.id" in a and a["gen_ai.request.id"].string_value == request_id:
            return a
    return None


def _stop_lengths(server, sink) -> list[int]:
    """The lengths of the stop strings in the gen_ai span of a request with a 1,000,000-character one."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
        r = c.completions.create(model="dummy", prompt="bounded", max_tokens=2, stop=["s" * 1_000_000, "zz"],
                                 extra_body={"ignore_eos": True})
    attrs = wait_until(lambda: _gen_ai_attrs(sink, r.id), timeout_s=15)
    assert attrs, "no gen_ai span for the request"
    return [len(v.string_value) for v in attrs["gen_ai.request.stop_sequences"].array_value.values]


def test_client_input_does_not_shape_span_names_or_sizes(server, sink):
    """50 requests to random unknown paths: one span name (`GET`), and OpenAI's error body. A stop
    string of 1,000,000 characters: cut to 4096 (the default value-length limit) in the gen_ai span."""
    import uuid

    paths = {f"/v1/{uuid.uuid4().hex}/{i}" for i in range(50)}
    for path in paths:
        r = httpx.get(f"{server.url}{path}", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == 404
    spans = wait_until(lambda: (lambda s: s if len(s) == 50 else None)(
        [s for s in sink.snapshot() if any(a.key == "url.path" and a.value.string_value in paths
                                           for a in s.attributes)]), timeout_s=15)
    assert spans, "not all 50 spans arrived"
    assert {s.name for s in spans} == {"GET"}
    assert _stop_lengths(server, sink) == [4096, 2]


def test_value_length_limit_from_the_environment(sink):
    srv = sink.server(env={"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100"})
    try:
        assert _stop_lengths(srv, sink) == [100, 2]
    finally:
        srv.stop()
