"""serve_bench's time-sliced accounting (client stamps mapped to the server's running time), and
its pictures (`--plot`)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.serving.client import Result
from benchmarks.serving.summary import summarize
from benchmarks.serving.time_slicing import running_clock

REPO = Path(__file__).resolve().parents[2]


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


def _png(path: Path) -> np.ndarray:
    """The picture's pixels (rows, columns, RGBA), after checking it is a PNG."""
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    return matplotlib.image.imread(path)


def _serve_bench(tmp_path: Path, *args: str) -> tuple[dict, dict]:
    run = subprocess.run([sys.executable, "benchmarks/serve_bench.py", "--start-server", "--num-requests", "24",
                          "--max-tokens", "12", "--ignore-eos", "--concurrency", "8", "--plot", str(tmp_path), *args],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout), json.loads((tmp_path / "plots.json").read_text())


@pytest.mark.slow
def test_plot_draws_latency_cdfs_and_throughput_from_the_report(tmp_path):
    report, data = _serve_bench(tmp_path, "--rates", "40", "inf")
    assert "samples_ms" not in json.dumps(report)  # the samples go to the plots, not the report
    runs = report["runs"]
    assert [p["workload"] for p in data["throughput"]] == ["rate=40.0", "rate=inf"]
    for point, run in zip(data["throughput"], runs):
        assert point["output_token_throughput"] == run["output_token_throughput"]
        assert point["request_throughput"] == run["request_throughput"]
        cdf = data["latency_cdf"][run["workload"]]
        assert len(cdf["ttft"]) == len(cdf["e2e"]) == run["completed"] == 24
        assert len(cdf["itl"]) == run["itl_ms"]["n"]
        assert cdf["ttft"] == sorted(cdf["ttft"])
        assert np.mean(cdf["ttft"]) == pytest.approx(run["ttft_ms"]["mean"], abs=1e-3)
        assert np.percentile(cdf["e2e"], 99) == pytest.approx(run["e2e_ms"]["p99"], abs=1e-3)
        assert run["chunks"] == len(cdf["itl"]) + run["completed"]  # every token chunk, each request's first too
        for proc in ("api", "engine"):  # CPU per token and per chunk: the same seconds over more tokens
            cpu = run["server_cpu"][proc]
            assert cpu["us_per_token"] * run["total_completion_tokens"] == pytest.approx(
                cpu["us_per_chunk"] * run["chunks"], rel=0.02)
    for name in ("latency_cdf.png", "throughput.png"):
        pixels = _png(tmp_path / name)
        assert pixels.shape[:2] == (400, 1200)  # 12 x 4 in at 100 dpi
        assert len(np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0)) > 20  # lines, text, not blank


@pytest.mark.slow
def test_plot_draws_the_telemetry_comparison(tmp_path):
    report, data = _serve_bench(tmp_path, "--compare-telemetry", "--repeats", "1")
    assert data["telemetry"]["tok_s_per_round"] == report["tok_s_per_round"]
    assert set(data["latency_cdf"]) == {"on", "off"}
    assert len(data["latency_cdf"]["on"]["ttft"]) == report["rounds"][0]["on"]["completed"] == 24
    assert _png(tmp_path / "telemetry.png").shape[:2] == (400, 1200)
