"""vLLM's frontend admission limits through the real server: `--max-num-queued-reqs` counts unfinished
sequences (n counts n), `--max-num-queued-tokens` the prompt tokens of requests with no token yet. A
request past a limit gets 429 (or vLLM's own 503 with --admission-status 503; vLLM's messages, no Retry-After) before
anything of it is registered, and is counted in `vllm:admission_rejections_total{model_name, reason}`;
the accepted ones complete. The engine is frozen (SIGSTOP) while requests arrive, so which are accepted
depends on the counts alone, never on timing. Bad limits stop the server at start-up, naming the flag."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from array import array
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from api_server_harness import REPO, ServerProcess, sample, wait_until

from otel_llm import FinishReason
from otel_llm.server import ipc
from otel_llm.server.api.admission import BACKLOG_FULL, QUEUE_FULL
from otel_llm.server.config import ServerConfig
from otel_llm.server.engine_client import EngineClient
from otel_llm.server.engine_process import engine_pids

KINDS = ("completion", "completion_stream", "chat", "chat_stream")
TEN_TOKENS = list(range(5, 15))  # a completions prompt of exactly 10 tokens


def _call(client: openai.OpenAI, kind: str, prompt, n: int = 1, max_tokens: int = 3):
    """One request as a user makes it: its texts, or the error the client raised."""
    common = {"model": "dummy", "max_tokens": max_tokens, "n": n, "extra_body": {"ignore_eos": True}}
    messages = [{"role": "user", "content": str(prompt)}]
    try:
        if kind == "completion":
            return [c.text for c in client.completions.create(prompt=prompt, **common).choices]
        if kind == "chat":
            return [c.message.content for c in client.chat.completions.create(messages=messages, **common).choices]
        if kind == "completion_stream":
            return ["".join(c.choices[0].text for c in client.completions.create(prompt=prompt, stream=True, **common))]
        return ["".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            messages=messages, stream=True, **common) if c.choices)]
    except openai.APIStatusError as exc:
        return exc


def _assert_refused(result, message: str, status: int = 429) -> None:
    """429 `RateLimitError` by default; with `--admission-status 503` vLLM's own 503."""
    if status == 429:
        assert isinstance(result, openai.RateLimitError), result
        assert result.body == {"message": message, "type": "RateLimitError", "param": None, "code": 429}
    else:
        assert isinstance(result, openai.InternalServerError), result
        assert result.body == {"message": message, "type": "Service Unavailable", "param": None, "code": 503}
    assert result.status_code == status
    assert "retry-after" not in result.response.headers  # vLLM sends none


@contextlib.contextmanager
def _frozen_engine(server: ServerProcess):
    """The engine stopped (SIGSTOP): requests it accepted stay unfinished, with no token yet."""
    [pid] = engine_pids(server.proc.pid)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _send_frozen(server: ServerProcess, client: openai.OpenAI, calls: list, refused: int) -> tuple[list, int]:
    """`calls` ((kind, prompt) each) at once to a frozen engine; waits until `refused` of them were
    answered (only refusals can be), checks the rest are in flight, thaws the engine; all results."""
    with ThreadPoolExecutor(len(calls)) as pool:
        with _frozen_engine(server):
            futures = [pool.submit(_call, client, kind, prompt) for kind, prompt in calls]
            assert wait_until(lambda: sum(f.done() for f in futures) == refused, 30)
            in_flight = server.health().json()["in_flight"]
        results = [f.result(timeout=60) for f in futures]
    return results, in_flight


def _rejections(server: ServerProcess) -> dict:
    m = server.metrics()
    series = m.get("vllm:admission_rejections_total", {})
    assert all(dict(labels).keys() == {"model_name", "reason"} for labels in series), series  # no engine label
    return {dict(labels)["reason"]: v for labels, v in series.items() if dict(labels)["model_name"] == "dummy"}


@pytest.mark.slow
def test_max_num_queued_reqs_refuses_what_would_exceed_it_and_counts_it():
    server = ServerProcess("--max-num-queued-reqs", "2").start()
    try:
        assert _rejections(server) == {"max_num_queued_reqs": 0, "max_num_queued_tokens": 0}  # pre-created, as vLLM
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
            _assert_refused(_call(client, "completion", "x", n=3), QUEUE_FULL)  # 0 + 3 sequences > 2, even alone
            assert len(_call(client, "chat", "x", n=2)) == 2  # 0 + 2 fits
            results, in_flight = _send_frozen(server, client, [(kind, f"p{i}") for i, kind in enumerate(KINDS * 2)], 6)
            refused = [r for r in results if isinstance(r, Exception)]
            assert len(refused) == 6 and in_flight == 2
            for r in refused:
                _assert_refused(r, QUEUE_FULL)
            assert all(isinstance(r, list) and len(r) == 1 for r in results if r not in refused)
            assert wait_until(lambda: server.health().json()["in_flight"] == 0)
            assert len(_call(client, "completion", "again", n=2)) == 2  # nothing left counted
        assert _rejections(server) == {"max_num_queued_reqs": 7, "max_num_queued_tokens": 0}
        m = server.metrics()
        assert sample(m, "vllm:request_success_total") == sample(m, "vllm:request_success_total",
                                                                 finished_reason="length") == 4  # the accepted only
        assert sample(m, "vllm:e2e_request_latency_seconds_count") == 4
        assert sample(m, "vllm:num_requests_running") == sample(m, "vllm:num_requests_waiting") == 0
        assert sample(m, "otel_llm_telemetry_dropped_total") == 0
        assert sample(m, "http_requests_total", handler="/v1/completions", status="4xx") + \
            sample(m, "http_requests_total", handler="/v1/chat/completions", status="4xx") == 7
    finally:
        server.stop()


@pytest.mark.slow
def test_max_num_queued_tokens_counts_prompts_until_their_first_token():
    """With `--admission-status 503`: vLLM's own refusal."""
    server = ServerProcess("--max-num-queued-tokens", "20", "--admission-status", "503").start()
    try:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
            # A 30-token prompt is let in (the backlog is 0 < 20); once its first token came it no longer counts,
            # though it runs on (1000 tokens: far more than the moment until the engine is frozen).
            long = iter(client.completions.create(model="dummy", prompt=list(range(5, 35)), max_tokens=1000,
                                                  stream=True, extra_body={"ignore_eos": True}))
            next(long)
            # Frozen, 10-token prompts: backlog 0 and 10 let in, 20 >= 20 refused (the new prompt is not added).
            calls = [(kind, TEN_TOKENS) for kind in ("completion", "completion_stream") * 3]
            results, in_flight = _send_frozen(server, client, calls, 4)
            assert sum(1 for _ in long) > 0
            refused = [r for r in results if isinstance(r, Exception)]
            assert len(refused) == 4 and in_flight == 3
            for r in refused:
                _assert_refused(r, BACKLOG_FULL, 503)
            assert wait_until(lambda: server.health().json()["in_flight"] == 0)
            assert _call(client, "completion", TEN_TOKENS) and _call(client, "completion", TEN_TOKENS)
        assert _rejections(server) == {"max_num_queued_reqs": 0, "max_num_queued_tokens": 4}
        m = server.metrics()
        assert sample(m, "vllm:request_success_total") == sample(m, "vllm:request_success_total",
                                                                 finished_reason="length") == 5
        assert sample(m, "vllm:prompt_tokens_total") == 30 + 4 * 10
        assert sample(m, "otel_llm_telemetry_dropped_total") == 0
    finally:
        server.stop()


@pytest.mark.parametrize("args,named", [
    (["--max-num-queued-reqs", "0"], "--max-num-queued-reqs: invalid value '0': must be >= 1"),
    (["--max-num-queued-reqs", "-3"], "--max-num-queued-reqs: invalid value '-3'"),
    (["--max-num-queued-tokens", "1.5"], "--max-num-queued-tokens: invalid positive int value: '1.5'"),
    (["--max-num-queued-tokens", "lots"], "--max-num-queued-tokens: invalid positive int value: 'lots'"),
    (["--admission-status", "500"], "--admission-status: invalid choice: 500"),
])
def test_bad_limits_stop_the_server_at_start_up_naming_the_flag(args, named):
    r = subprocess.run([sys.executable, "-m", "otel_llm", "serve", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert named in r.stderr


@pytest.mark.parametrize("field,value", [("max_num_queued_reqs", 0), ("max_num_queued_tokens", -1),
                                         ("max_num_queued_tokens", 2.0), ("max_num_queued_reqs", True)])
def test_server_config_names_a_bad_limit(field, value):
    with pytest.raises(ValueError, match=f"--{field.replace('_', '-')} {value!r}: must be an integer >= 1"):
        ServerConfig(**{field: value})


class _NoTelemetry:
    enabled = capture_content = False


def _out(rid: int, seq: int, reason: FinishReason | None = None) -> ipc.SeqOutput:
    return ipc.SeqOutput(rid, seq, array("i", [7]), "x", reason is not None, -1 if reason is None else int(reason), 0, 0)


def test_engine_client_counts_sequences_and_prefill_backlog_as_vllm_does():
    async def scenario() -> list:
        client = EngineClient(ServerConfig(engine_restarts=0))
        client._loop, client._tel, client._texts = asyncio.get_running_loop(), _NoTelemetry(), None
        client.engine._conn, engine_end = mp.Pipe()
        client.engine._loop = client._loop
        counts = []

        def note() -> None:
            counts.append((client.num_queued_seqs, client.num_queued_prompt_tokens))

        client.add(ipc.AddRequest(1, [1] * 10, n=3))
        client.add(ipc.AddRequest(2, [1] * 4))
        note()  # 3 + 1 sequences; 10 x 3 + 4 prompt tokens before any token
        client._on_event(ipc.Step([_out(1, 0), _out(1, 1), _out(1, 2)], None))
        note()  # request 1 past prefill: its prompt no longer counts
        client._on_event(ipc.Step([_out(1, 1, FinishReason.STOP), _out(2, 0, FinishReason.LENGTH)], None))
        note()  # finished sequences stop counting when the engine says so, before their reader releases them
        client.release(2)
        client._on_event(ipc.Step([_out(1, 0, FinishReason.ABORT)], None))
        note()  # ABORT ends every sequence of its request
        client.add(ipc.AddRequest(3, [1] * 5, n=2))
        client.abort(3, 2)
        note()  # an aborted request stops counting at once (vLLM: OutputProcessor.abort_requests)
        client.engine._conn.close()
        engine_end.close()
        return counts

    assert asyncio.run(scenario()) == [(4, 34), (4, 4), (2, 0), (0, 0), (0, 0)]
