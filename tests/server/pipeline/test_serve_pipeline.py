"""`otel-llm serve-pipeline` as a user runs it: a real server process, the real `openai` client.

What the client received is checked against what `/metrics` counted: requests by finish reason
(pipeline and stage 0), one transfer hop per engine output (one token each: the completion tokens
the client was told about) with the bytes it carried, audio frames (the PCM samples the client
decoded), TTFP and e2e, tokens (the client's usage), queue wait, each stage's generation time,
the talker's in-queue time and every stage's waiting requests, completed speech streams; a closed
stream counts as `abort`, a `client_disconnect` failure and an aborted speech stream; the
pipeline's span tree hangs under the client's `traceparent`; stats off leaves no pipeline or stage
family on `/metrics`."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest

from otel_llm.cli import build_parser
from otel_llm.server.cli import config_from_args, pipeline_config_from_args
from otel_llm.server.pipeline.pipeline_config import PipelineServerConfig
from otel_llm.server.pipeline.talker_messages import HEADER_BYTES
from tests.harness import promtool_check_metrics
from tests.server.api.api_server_harness import ServerProcess, sample, wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
AUDIO = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
STAGE0 = {"stage": "0", "replica": "0"}


@pytest.fixture(scope="module")
def server(sink):
    srv = sink.server("--log-stats-interval", "1", command="serve-pipeline")
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
        yield c


def _streamed(client, prompt: str, max_tokens: int) -> tuple[bytes, str, int, str, int]:
    """(PCM, transcript, completion tokens, finish reason, prompt tokens) of a streamed audio request."""
    pcm, transcript, reason, tokens, prompt_tokens = [], [], None, None, None
    for chunk in client.chat.completions.create(
            model="dummy", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True, **AUDIO}):
        if chunk.usage is not None:
            tokens, prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
        if not chunk.choices:
            continue
        audio = getattr(chunk.choices[0].delta, "audio", None)
        if audio:
            pcm.append(base64.b64decode(audio.data or ""))
            transcript.append(audio.transcript or "")
        reason = chunk.choices[0].finish_reason or reason
    return b"".join(pcm), "".join(transcript), tokens, reason, prompt_tokens


def _whole(client, prompt: str, max_tokens: int) -> tuple[bytes, str, int, str, int]:
    r = client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": prompt}],
                                       max_tokens=max_tokens, extra_body={"ignore_eos": True, **AUDIO})
    choice = r.choices[0]
    assert choice.message.content is None
    return (base64.b64decode(choice.message.audio.data), choice.message.audio.transcript, r.usage.completion_tokens,
            choice.finish_reason, r.usage.prompt_tokens)


def _totals(metrics: dict) -> dict:
    return {
        "success": sample(metrics, "vllm_omni:requests_success_total", finished_reason="length"),
        "stage0": sample(metrics, "vllm:request_success_total", finished_reason="length", **STAGE0),
        "hops": sample(metrics, "vllm_omni:transfer_size_bytes_count", from_stage="0", to_stage="1"),
        "hop_bytes": sample(metrics, "vllm_omni:transfer_size_bytes_sum", from_stage="0", to_stage="1"),
        "tx": sample(metrics, "vllm_omni:transfer_tx_s_count"),
        "rx": sample(metrics, "vllm_omni:transfer_rx_s_count"),
        "in_flight": sample(metrics, "vllm_omni:transfer_in_flight_s_count"),
        "frames": sample(metrics, "vllm_omni:audio_frames_total", stage="1"),
        "ttfp_count": sample(metrics, "vllm_omni:audio_ttfp_s_count"),
        "ttfp_sum": sample(metrics, "vllm_omni:audio_ttfp_s_sum"),
        "e2e_count": sample(metrics, "vllm_omni:e2e_request_latency_s_count"),
        "e2e_sum": sample(metrics, "vllm_omni:e2e_request_latency_s_sum"),
        "prompt_tokens": sample(metrics, "vllm_omni:prompt_tokens_total"),
        "generation_tokens": sample(metrics, "vllm_omni:generation_tokens_total"),
        "queue_wait": sample(metrics, "vllm_omni:request_queue_wait_s_count"),
        "gen_time0": sample(metrics, "vllm_omni:stage_gen_time_s_count", stage="0", stage_type="llm"),
        "gen_time1": sample(metrics, "vllm_omni:stage_gen_time_s_count", stage="1", stage_type="llm"),
        "in_queue1": sample(metrics, "vllm_omni:stage_in_queue_s_count", stage="1"),
        "streams": sample(metrics, "vllm_omni:speech_stream_completed_total"),
        "failed": sample(metrics, "vllm_omni:requests_failed_total"),
    }


def test_audio_responses_tell_the_thinkers_timings_and_their_trace(server, client):
    """A request's return_timings: the thinker's `timings` on the audio body and the final streamed chunk,
    and the traceresponse header naming the request's trace."""
    ask = {"ignore_eos": True, "return_timings": True, **AUDIO}
    raw = client.chat.completions.with_raw_response.create(
        model="dummy", messages=[{"role": "user", "content": "hi"}], max_tokens=3, extra_body=ask)
    whole = raw.parse()
    assert whole.model_extra["timings"]["completion_tokens"] == whole.usage.completion_tokens == 3
    assert 0 < whole.model_extra["timings"]["ttft"] <= whole.model_extra["timings"]["e2e"]
    assert raw.headers["traceresponse"].startswith("00-") and raw.headers["traceresponse"].endswith("-01")
    chunks = list(client.chat.completions.create(
        model="dummy", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True,
        stream_options={"include_usage": True}, extra_body=ask))
    assert [i for i, c in enumerate(chunks) if (c.model_extra or {}).get("timings")] == [len(chunks) - 1]
    assert chunks[-1].model_extra["timings"]["completion_tokens"] == chunks[-1].usage.completion_tokens == 3


@pytest.mark.slow
def test_metrics_count_exactly_what_the_client_received(server, client):
    before = _totals(server.metrics())
    results = [(_streamed if i % 2 else _whole)(client, f"say {i}", 3 + 2 * i) for i in range(6)]
    after = _totals(server.metrics())
    delta = {k: after[k] - before[k] for k in after}
    tokens = sum(r[2] for r in results)
    assert tokens == sum(3 + 2 * i for i in range(6)) and {r[3] for r in results} == {"length"}
    assert delta["success"] == 6 and delta["stage0"] == 6  # pipeline and stage 0 agree
    assert delta["hops"] == tokens  # one hop per engine output, one token each
    assert delta["tx"] == delta["rx"] == delta["in_flight"] == tokens
    assert delta["hop_bytes"] == tokens * HEADER_BYTES + sum(len(r[1].encode()) for r in results)
    assert delta["frames"] == sum(len(r[0]) for r in results) / 2  # PCM16: 2 bytes a sample
    assert all(r[0] for r in results)
    assert delta["ttfp_count"] == 6 and delta["e2e_count"] == 6
    assert 0 < delta["ttfp_sum"] <= delta["e2e_sum"]
    assert delta["prompt_tokens"] == sum(r[4] for r in results) and delta["generation_tokens"] == tokens
    assert delta["queue_wait"] == delta["gen_time0"] == delta["gen_time1"] == delta["in_queue1"] == 6
    assert delta["streams"] == 3 and delta["failed"] == 0  # the streamed half
    metrics = server.metrics()
    for replica in ("0", "1"):  # sequential requests alternate between the idle replicas
        assert sample(metrics, "vllm_omni:audio_frames_total", stage="1", replica=replica) > 0
    assert sample(metrics, "vllm_omni:num_requests_running") == 0
    assert sample(metrics, "vllm_omni:num_requests_waiting") == 0
    assert sample(metrics, "vllm_omni:audio_skipped_requests_total") == 0
    waiting = {dict(k)["stage"]: v for k, v in metrics["vllm_omni:stage_waiting_requests"].items()}
    assert waiting == {"0": 0, "1": 0}  # the engine's scheduler, the talker replicas: nothing waits now


@pytest.mark.slow
def test_closing_the_stream_counts_as_abort(server, client):
    before = server.metrics()
    stream = client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "go on"}],
                                            max_tokens=2000, stream=True, extra_body={"ignore_eos": True, **AUDIO})
    for chunk in stream:
        if chunk.choices and getattr(chunk.choices[0].delta, "audio", None):
            break
    stream.close()

    def counted(name, **labels):
        return sample(server.metrics(), name, finished_reason="abort", **labels) - sample(before, name,
                                                                                          finished_reason="abort",
                                                                                          **labels)
    assert wait_until(lambda: counted("vllm_omni:requests_success_total") == 1)
    assert wait_until(lambda: counted("vllm:request_success_total", **STAGE0) == 1)  # the engine aborted it
    after = server.metrics()
    for name in ("vllm_omni:requests_failed_total", "vllm_omni:speech_stream_aborted_total"):
        assert sample(after, name) - sample(before, name) == 1, name
    assert sample(after, "vllm_omni:requests_failed_total", reason="client_disconnect") == sample(
        before, "vllm_omni:requests_failed_total", reason="client_disconnect") + 1
    assert sample(after, "vllm_omni:speech_stream_completed_total") == sample(
        before, "vllm_omni:speech_stream_completed_total")
    assert wait_until(lambda: sample(server.metrics(), "vllm_omni:num_requests_running") == 0)
    assert server.health().json()["in_flight"] == 0


@pytest.mark.slow
def test_text_only_requests_are_served_as_by_serve(server, client):
    before = sample(server.metrics(), "vllm:request_success_total", **STAGE0)
    r = client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "text"}], max_tokens=4,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].message.content and r.usage.completion_tokens == 4
    assert sample(server.metrics(), "vllm:request_success_total", **STAGE0) == before + 1
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "x"}], n=2,
                                       extra_body=AUDIO)
    assert exc.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "x"}],
                                       modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
    assert exc.value.body["param"] == "audio.format"


@pytest.mark.slow
def test_metrics_pass_promtool(server, client):
    _whole(client, "lint", 3)
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert "vllm_omni:transfer_in_flight_s_bucket" in text and 'stage="0",replica="0"' in text
    findings = promtool_check_metrics(text)  # it parses all of it (else PromtoolError) ...
    own = ("vllm:", "vllm_omni:")  # ... and lints only vLLM(-Omni)'s own names
    assert [f for f in findings if not f.startswith(own)] == []
    otel = httpx.get(f"{server.url}/metrics?compat=otel", timeout=10).text  # every family under its OTel name
    assert "otel_llm_pipeline_requests_finished_total{" in otel and "vllm_omni:" not in otel
    assert [f for f in promtool_check_metrics(otel) if "otel_llm_pipeline" in f] == []


@pytest.mark.slow
def test_span_tree_under_the_client_traceparent(server, sink):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                   headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"},
                   json={"model": "dummy", "messages": [{"role": "user", "content": "traced"}], "max_tokens": 4,
                         "ignore_eos": True, **AUDIO})
    assert r.status_code == 200
    tokens = r.json()["usage"]["completion_tokens"]

    def tree():
        spans = [s for s in sink.snapshot() if s.trace_id.hex() == TRACE_ID]
        root = next((s for s in spans if s.name == "pipeline dummy"), None)
        if root is None:
            return None
        children = [s for s in spans if s.parent_span_id == root.span_id]
        return (root, spans, children) if len(children) == 2 + tokens else None

    found = wait_until(tree, timeout_s=15)
    assert found, [s.name for s in sink.snapshot() if s.trace_id.hex() == TRACE_ID]
    root, spans, children = found
    http = next(s for s in spans if s.span_id == root.parent_span_id)  # the HTTP SERVER span ...
    assert http.name == "POST /v1/chat/completions" and http.parent_span_id.hex() == PARENT_SPAN_ID  # ... the client's
    names = sorted(s.name for s in children)
    assert names == ["stage 0", "stage 1"] + ["transfer 0->1"] * tokens
    for s in children:
        assert root.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= root.end_time_unix_nano


@pytest.mark.slow
def test_stats_off_serves_audio_without_pipeline_or_stage_families():
    srv = ServerProcess("--disable-log-stats", command="serve-pipeline").start()
    try:
        with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=60) as c:
            pcm, transcript, tokens, reason, _ = _streamed(c, "quiet", 5)
        assert pcm and tokens == 5 and reason == "length"
        text = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert "vllm_omni:" not in text and "vllm:" not in text and 'stage="' not in text
    finally:
        srv.stop()


def test_cli_flags():
    args = build_parser().parse_args(["serve-pipeline", "--model", "dummy", "--talker-replicas", "3",
                                      "--omni-metrics-prefix", "vllm:omni_", "--disable-log-stats"])
    assert not config_from_args(args).engine.log_stats
    pipeline = pipeline_config_from_args(args)
    assert pipeline == PipelineServerConfig(3, "tone", "vllm:omni_")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve-pipeline", "--talker-backend", "piper"])


@pytest.mark.slow
def test_the_periodic_log_has_a_line_per_stage_and_transfer_edge(server, client):
    _streamed(client, "log line", 8)
    lines = wait_until(lambda: [line for line in server.output().splitlines() if "Transfer 0:0 -> 1:" in line],
                       timeout_s=10)
    assert lines and "Hops: " in lines[-1] and "Avg in-flight: " in lines[-1]
    out = server.output()
    assert "Pipeline dummy: Finished: " in out and "Audio 1:" in out


@pytest.mark.slow
def test_every_family_served_under_load_is_the_released_vllm_omnis(server, client):
    """A `serve-pipeline` run under load (concurrent streamed and whole requests, a stream the client
    closes): each `vllm_omni:` family on `/metrics` has vLLM-Omni 0.30's type, HELP, labels and buckets."""
    from concurrent.futures import ThreadPoolExecutor

    from prometheus_client.parser import text_string_to_metric_families

    from tests.otel_llm.pipeline.released_omni import families

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: (_streamed if i % 2 else _whole)(client, f"load {i}", 4 + i % 5), range(16)))
    stream = client.chat.completions.create(model="dummy", messages=[{"role": "user", "content": "cut"}],
                                            max_tokens=2000, stream=True, extra_body={"ignore_eos": True, **AUDIO})
    next(c for c in stream if c.choices and getattr(c.choices[0].delta, "audio", None))
    stream.close()
    assert wait_until(lambda: sample(server.metrics(), "vllm_omni:requests_failed_total") > 0)
    released = families()
    served = [f for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics", timeout=10).text)
              if f.name.startswith("vllm_omni:")]
    assert len(served) >= 22  # all 24 but the skipped-audio counter and, maybe, the stream aborts
    for fam in served:
        theirs = released[fam.name]
        assert (fam.type, fam.documentation) == (theirs.kind, theirs.help), fam.name
        labels = {tuple(sorted(set(s.labels) - {"le"})) for s in fam.samples}
        assert labels == {tuple(sorted(theirs.labels))}, fam.name
        if fam.type == "histogram":
            bounds = [float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")]
            assert tuple(sorted(set(bounds)))[:-1] == theirs.buckets, fam.name  # +Inf last
