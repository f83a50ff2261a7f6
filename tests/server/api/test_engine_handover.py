"""The engine dies between the server's liveness check and the hand-over of a request (its pipe
refuses the ADD): the request was registered, so it is counted as finished with `error`, and its
503 says it reached the engine as it stopped, not that the engine was already down (whose 503
is not counted): a client can match the server's counts exactly (benchmarks/soak.py does)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from otel_llm import Telemetry, TelemetryConfig
from otel_llm.server.api.errors import OpenAIError
from otel_llm.server.api.serving import ENGINE_LOST_AT_HANDOVER, OpenAIServing, _Prepared
from otel_llm.server.config import ServerConfig
from otel_llm.server.engine_client import EngineClient
from otel_llm.server.model import load_tokenizer


async def _serve_into_a_dead_pipe(tel: Telemetry):
    client = EngineClient(ServerConfig(engine_restarts=0))
    client._loop, client._tel, client._texts = asyncio.get_running_loop(), tel, None
    client.engine._conn = _Refusing()  # the engine is gone, and the API side has not noticed yet
    client.engine.max_model_len = 64
    serving = OpenAIServing(client, tel, load_tokenizer("dummy"), "dummy")
    p = _Prepared("cmpl-1", "text_completion", [1, 2, 3], 5, 5, 1, 1.0, 1.0, 0, None, (), False, False, False)
    request = Request({"type": "http", "state": {}})
    with pytest.raises(OpenAIError) as raised:
        await serving._serve(p, request, chat=False, content=lambda: [])
    return raised.value, client


class _Refusing:
    def send_bytes(self, data: bytes) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_request_handed_to_a_dead_engine_is_counted_and_told_so():
    tel = Telemetry(TelemetryConfig(model_name="dummy"))
    error, client = asyncio.run(_serve_into_a_dead_pipe(tel))
    assert (error.status, error.message) == (503, ENGINE_LOST_AT_HANDOVER)
    assert not client._streams  # nothing of it stays registered
    text = tel.render().decode()
    assert 'vllm:request_success_total{model_name="dummy",engine="0",finished_reason="error"} 1.0' in text
