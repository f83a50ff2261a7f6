"""EngineClient delivery order on the event loop: a step's first and last tokens reach
their streams first, then the step's receive time is stamped (it ends TTFT and e2e), then
the other tokens go out, and the step's telemetry is ingested last, with that stamp;
failures reported later (engine death) never overtake telemetry already queued."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from array import array

from otel_llm.server import ipc
from otel_llm.server.config import ServerConfig
from otel_llm.server.engine_client import EngineClient, EngineDead


class _OrderLog:
    """Stands in for `otel_llm.Telemetry`: records when the client calls it."""

    enabled, capture_content = True, False

    def __init__(self, log: list):
        self.log = log

    def ingest(self, data, received_ns=None) -> None:
        self.log.append(("ingest", data))
        self.log.append(("received", received_ns))

    def fail(self, handle, reason) -> None:
        self.log.append(("fail", handle))

    def engine_gone(self) -> None:
        self.log.append(("gone",))


def _out(rid: int, finished: bool = False) -> ipc.SeqOutput:
    return ipc.SeqOutput(rid, 0, array("i", [7]), "x", finished, 0 if finished else -1, 3, 0)


async def _scenario() -> list:
    log: list = []
    client = EngineClient(ServerConfig(engine_restarts=0))
    client._loop, client._tel, client._texts = asyncio.get_running_loop(), _OrderLog(log), None
    client.engine._conn, engine_end = mp.Pipe()
    client.engine._loop = client._loop

    async def consume(rid: int, queue: asyncio.Queue) -> None:
        while True:
            item = await queue.get()
            if isinstance(item, EngineDead):
                log.append(("dead", rid))
                return
            log.append(("token", rid))
            log.append(("at", time.monotonic_ns()))
            if item.finished:
                client.release(rid)  # as OpenAIServing does once all sequences finished
                return

    consumers = [asyncio.create_task(consume(rid, client.add(ipc.AddRequest(rid, [1, 2, 3]))))
                 for rid in (1, 2, 3)]
    await asyncio.sleep(0)  # every consumer waits on its queue
    client._on_event(ipc.Step([_out(1)], b"A"))  # request 1's first token
    await asyncio.sleep(0.01)
    log.append("|")
    # 1 is running, 2 gets its first token, 3 its last.
    client._on_event(ipc.Step([_out(1), _out(2), _out(3, finished=True)], b"B"))
    await asyncio.sleep(0.01)
    log.append("|")
    client._on_event(ipc.Step([_out(1), _out(2)], b"C"))
    client.engine._on_dead("engine process exited (exit code 9)", client.engine._generation)
    await asyncio.gather(*consumers)
    client.engine._conn.close()
    engine_end.close()
    return log


def test_first_and_last_tokens_are_stamped_then_the_rest_go_out_before_telemetry():
    log = asyncio.run(_scenario())
    first, second, third = (_stamped(part) for part in _split(log))
    assert [e[:2] for e in first] == [("token", 1), ("ingest", b"A")]
    assert first[0][2] <= first[1][2]  # step A's receive time: after request 1's first token went out
    # Step B: 2 gets its first token and 3 its last; 1 is running: it goes out after the stamp.
    assert [e[:2] for e in second] == [("token", 2), ("token", 3), ("token", 1), ("ingest", b"B")]
    assert second[1][2] <= second[3][2] <= second[2][2]
    # Step C: no first or last tokens; then the engine dies. The step's telemetry is
    # ingested before the failures of the requests it still mentions.
    events = [e[:2] for e in third]
    assert ("ingest", b"C") in events
    assert sorted(e for e in events if e[0] == "fail") == [("fail", 1), ("fail", 2)]
    assert events.index(("ingest", b"C")) < min(events.index(("fail", 1)), events.index(("fail", 2)))
    assert ("dead", 1) in events and ("dead", 2) in events
    assert events.index(("gone",)) > max(events.index(("fail", 1)), events.index(("fail", 2)))  # gauges to 0 last


def _stamped(part: list) -> list[tuple]:
    """Joins each token with the time it went out and each ingest with its receive time."""
    out = []
    for entry in part:
        if entry[0] in ("at", "received"):
            out[-1] = (*out[-1], entry[1])
        else:
            out.append(entry)
    return out


def _split(log: list) -> list[list]:
    parts, current = [], []
    for entry in log:
        if entry == "|":
            parts.append(current)
            current = []
        else:
            current.append(entry)
    return parts + [current]
