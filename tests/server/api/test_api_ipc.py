"""The flat-bytes wire format between the API and engine processes round-trips."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest

from otel_llm import FinishReason
from otel_llm.server import ipc


def test_add_round_trip():
    cmd = ipc.AddRequest(rid=(1 << 40) + 7, prompt_token_ids=(1, 2, 300000), n=3, temperature=0.5, top_p=0.9,
                         top_k=40, seed=-12, max_tokens=17, ignore_eos=True, stop=("é\n", "END"),
                         stop_token_ids=(5, 6))
    back = ipc.decode_command(ipc.encode_command(cmd))
    assert back == ipc.AddRequest(cmd.rid, array("i", [1, 2, 300000]), 3, 0.5, 0.9, 40, -12, 17, True,
                                  ("é\n", "END"), (5, 6))


def test_add_defaults_round_trip():
    back = ipc.decode_command(ipc.encode_command(ipc.AddRequest(1, [9])))
    assert back.seed is None and back.max_tokens is None and back.stop == () and list(back.prompt_token_ids) == [9]


def test_abort_and_shutdown():
    assert ipc.decode_command(ipc.encode_command(ipc.AbortRequest(-5))) == ipc.AbortRequest(-5)
    assert isinstance(ipc.decode_command(ipc.encode_command(ipc.Shutdown())), ipc.Shutdown)


def _out(rid, seq, toks, text, finished=False, reason=None):
    return SimpleNamespace(rid=rid, seq_index=seq, new_token_ids=toks, text_delta=text, finished=finished,
                           finish_reason=reason, num_prompt_tokens=11, num_cached_tokens=4)


@pytest.mark.parametrize("telemetry", [None, b"", b"\x00\x01opaque"])
def test_step_round_trip(telemetry):
    outs = [_out(1, 0, [5], "a"), _out(1, 1, [6, 7], "ü€"), _out(2, 0, [], "", True, FinishReason.ABORT),
            _out(3, 0, [8], "z", True, FinishReason.LENGTH)]
    step = ipc.decode_event(ipc.encode_step(outs, telemetry))
    assert step.telemetry == telemetry
    got = [(o.rid, o.seq_index, list(o.token_ids), o.text, o.finished, o.finish_reason, o.num_prompt_tokens,
            o.num_cached_tokens) for o in step.outputs]
    assert got == [(1, 0, [5], "a", False, -1, 11, 4), (1, 1, [6, 7], "ü€", False, -1, 11, 4),
                   (2, 0, [], "", True, int(FinishReason.ABORT), 11, 4), (3, 0, [8], "z", True, 1, 11, 4)]


def test_other_events():
    assert ipc.decode_event(ipc.encode_ready("m", 2048, 42)) == ipc.Ready("m", 2048, 42)
    assert ipc.decode_event(ipc.encode_reject(3, "too long")) == ipc.Reject(3, "too long")
    assert ipc.decode_event(ipc.encode_fatal("boom", True)) == ipc.Fatal("boom", True)


def test_unknown_kind_raises():
    with pytest.raises(ValueError):
        ipc.decode_event(b"\xff")
    with pytest.raises(ValueError):
        ipc.decode_command(b"\xff")
