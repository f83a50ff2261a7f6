"""serve_bench's time-sliced accounting: client stamps mapped to the server's running time."""

import numpy as np
import pytest

from benchmarks.serve_bench import Result, running_clock, summarize


def test_running_clock_counts_only_the_windows():
    clock = running_clock([(10.0, 10.5), (12.0, 12.25), (20.0, 21.0)])
    stamps = [9.0, 10.0, 10.2, 10.5, 11.0, 12.1, 12.25, 15.0, 20.5, 30.0]
    expected = [0.0, 0.0, 0.2, 0.5, 0.5, 0.6, 0.75, 0.75, 1.25, 1.75]
    np.testing.assert_allclose(clock(stamps), expected)


def test_summarize_takes_pauses_out_of_every_interval():
    # The server ran in [0, 1) and [3, 4): a request sent at 0.5 got chunks at 0.75, 0.9 and
    # (after the pause) 3.1, and its stream ended at 3.2.
    clock = running_clock([(0.0, 1.0), (3.0, 4.0)])
    r = Result(ok=True, t_send=0.5, times=[0.75, 0.9, 3.1], t_end=3.2, prompt_tokens=4, completion_tokens=3)
    s = summarize([r], 0.5, 3.2, clock)
    assert s["wall_s"] == pytest.approx(0.7)
    assert s["output_token_throughput"] == pytest.approx(3 / 0.7)
    assert s["ttft_ms"]["mean"] == pytest.approx(250.0)
    assert s["itl_ms"]["n"] == 2 and s["itl_ms"]["p99"] == pytest.approx(199.0, abs=1.0)  # 150 and 200 ms
    assert s["e2e_ms"]["mean"] == pytest.approx(700.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(225.0)  # (e2e - ttft) / 2


def test_summarize_counts_failures_and_chunkless_requests():
    ok = Result(ok=True, t_send=0.0, times=[0.1], t_end=0.2, completion_tokens=1)
    failed = Result(error="HTTP 400")
    empty = Result(ok=True, t_send=0.0, times=[], t_end=0.1)
    s = summarize([ok, failed, empty], 0.0, 1.0)
    assert (s["completed"], s["failed"]) == (1, 2)
    assert s["errors"] == ["HTTP 400", "no token chunk"]
    assert s["itl_ms"] is None and s["tpot_ms"] is None
