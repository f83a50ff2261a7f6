"""The talker stage on its own: the wire format, replicas synthesising as text arrives, sticky
least-loaded placement, transfer hops whose timestamps are causal, cancellation, the config."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from otel_llm.pipeline.hop import TransferHop, valid_hop
from otel_llm.server.pipeline import SynthConfig, make_synth
from otel_llm.server.pipeline.pipeline_config import PipelineServerConfig
from otel_llm.server.pipeline.talker import Talker
from otel_llm.server.pipeline.talker_messages import CANCEL, FINAL, HEADER_BYTES, TextDelta
from otel_llm.server.pipeline.talker_session import TalkerSession


def test_text_delta_round_trip():
    delta = TextDelta(7, 3, "héllo", FINAL)
    data = delta.encode()
    assert len(data) == HEADER_BYTES + len("héllo".encode())
    assert TextDelta.decode(data) == delta and delta.final and not delta.cancelled
    assert TextDelta.decode(TextDelta(1, 0, "", CANCEL).encode()).cancelled
    with pytest.raises(ValueError, match="header bytes"):
        TextDelta.decode(b"\x00")


@pytest.fixture
def talker():
    t = Talker(2, "tone")
    yield t
    t.close()


async def _speak(session: TalkerSession, pieces: list[str]) -> list:
    for i, text in enumerate(pieces):
        session.send(text, final=i == len(pieces) - 1)
    chunks = []
    while not chunks or not chunks[-1].final:
        chunks.append(await asyncio.wait_for(session.outputs.get(), 10))
    return chunks


async def test_a_replica_speaks_the_text_as_it_arrives(talker):
    session = TalkerSession(talker, "alloy", asyncio.get_running_loop())
    pieces = ["Hel", "", "lo, ", "world"]
    chunks = await _speak(session, pieces)
    assert [c.seq for c in chunks] == [0, 1, 2, 3] and [c.transcript for c in chunks] == pieces
    pcm = b"".join(b for c in chunks for b in c.pcm)
    assert pcm == make_synth(SynthConfig(voice="alloy")).synthesise("".join(pieces))  # incremental == at once
    for c in chunks:
        session.received(c)
    assert session.num_hops == len(pieces)
    rows = np.frombuffer(session.take_hops(), np.int64).reshape(-1, 5).tolist()
    hops = [TransferHop(*session.edge, *row) for row in rows]
    assert session.num_hops == 0 and len(session.take_hops()) == 0
    assert all(valid_hop(h) for h in hops)  # tx_start <= tx_end <= rx_start <= rx_end, one clock
    assert [h.size_bytes for h in hops] == [HEADER_BYTES + len(p.encode()) for p in pieces]
    assert {(h.from_stage, h.from_replica, h.to_stage, h.to_replica) for h in hops} == {
        ("0", "0", "1", session.replica.name)}
    assert chunks[0].work_start_ns <= chunks[-1].done_ns
    session.close()
    assert session.replica.active == 0


async def test_written_audio_is_kept_until_taken_and_the_first_audio_is_flagged(talker):
    session = TalkerSession(talker, "alloy", asyncio.get_running_loop())
    assert not session.written([]) and not session.written([0])  # no audio yet: nothing to hand over at once
    assert session.written([0, 960])  # the response's first audio: hand it over now (TTFP)
    assert not session.written([480])
    times, sizes = session.take_audio()
    assert list(sizes) == [0, 0, 960, 480] and list(times) == sorted(times)
    assert [len(a) for a in session.take_audio()] == [0, 0]
    session.close()


async def test_a_session_with_stats_off_takes_no_hop_timestamps(talker):
    session = TalkerSession(talker, "alloy", asyncio.get_running_loop(), record_hops=False)
    chunks = await _speak(session, ["Hel", "lo"])
    for c in chunks:
        session.received(c)
    assert session.finished and session.num_hops == 0 and len(session.take_hops()) == 0 and not session._sent
    assert not session.written([960]) and [len(a) for a in session.take_audio()] == [0, 0]
    session.close()


async def test_placement_is_least_loaded_then_round_robin(talker):
    loop = asyncio.get_running_loop()
    a, b = TalkerSession(talker, "alloy", loop), TalkerSession(talker, "alloy", loop)
    assert {a.replica.name, b.replica.name} == {"0", "1"}
    c = TalkerSession(talker, "alloy", loop)  # both busy: any; then the other one is the least loaded
    d = TalkerSession(talker, "alloy", loop)
    assert c.replica is not d.replica
    for s in (a, b, c, d):
        s.close()
    names = []
    for _ in range(4):  # idle replicas: sequential requests alternate
        s = TalkerSession(talker, "echo", loop)
        names.append(s.replica.name)
        s.close()
    assert names in (["0", "1", "0", "1"], ["1", "0", "1", "0"])


async def test_a_request_waits_at_its_replica_from_its_first_text_to_its_first_chunk(talker):
    loop = asyncio.get_running_loop()
    a, b = TalkerSession(talker, "alloy", loop), TalkerSession(talker, "alloy", loop)
    assert a.replica is not b.replica and a.replica.waiting == b.replica.waiting == 0  # opened: no text yet
    a.send("one", final=False)
    a.send("two", final=True)
    b.send("x", final=False)
    assert (a.replica.waiting, b.replica.waiting) == (1, 1) and a.queued_ns > 0  # a request, not its deltas
    first = await asyncio.wait_for(a.outputs.get(), 10)
    a.received(first)
    assert a.replica.waiting == 0 and first.work_start_ns >= a.queued_ns  # the stage's in-queue time
    b.close()  # over before the replica started on it: it no longer waits there
    assert b.replica.waiting == 0
    a.close()
    assert a.replica.waiting == 0


async def test_a_cancelled_session_gets_nothing_more(talker):
    loop = asyncio.get_running_loop()
    session = TalkerSession(talker, "alloy", loop)
    session.send("abc", final=False)
    first = await asyncio.wait_for(session.outputs.get(), 10)
    assert first.transcript == "abc" and not first.final
    session.close()  # not finished: cancelled on the replica
    assert session.replica.active == 0
    session.send("more", final=True)
    other = TalkerSession(talker, "alloy", loop)  # the replica goes on serving others
    assert [c.transcript for c in await _speak(other, ["ok"])] == ["ok"]
    await asyncio.sleep(0.05)
    assert session.outputs.empty()
    other.close()


def test_pipeline_config_names_the_bad_value():
    assert PipelineServerConfig() == PipelineServerConfig(2, "tone", "vllm_omni:")
    with pytest.raises(ValueError, match=r"--talker-replicas 0"):
        PipelineServerConfig(talker_replicas=0)
    with pytest.raises(ValueError, match=r"--talker-backend 'piper'"):
        PipelineServerConfig(talker_backend="piper")
    with pytest.raises(ValueError, match=r"--omni-metrics-prefix 'omni_'"):
        PipelineServerConfig(omni_metrics_prefix="omni_")
