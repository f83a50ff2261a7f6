"""pipeline_bench, one small round: both servers served every request, the stats-on server's counts
were exact, and the JSON carries the figures the README quotes (ratios and server CPU per token)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_one_round_prints_valid_figures():
    run = subprocess.run([sys.executable, "benchmarks/pipeline_bench.py", "--repeats", "1", "--num-requests", "12",
                          "--concurrency", "4", "--max-tokens", "8", "--slice", "0.1"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert out["valid"] and out["failed_requests"] == 0 and out["counts_exact_every_round"]
    assert len(out["throughput_ratio_per_round"]) == 1 and out["throughput_ratio_on_vs_off"] > 0
    assert set(out["tok_s_per_round"]) == {"off", "on"}
    for proc in ("api", "engine"):
        cpu = out["server_cpu_us_per_token"][proc]
        assert cpu["off"] > 0 and cpu["on"] > 0 and cpu["ratio_on_vs_off"] == pytest.approx(cpu["on"] / cpu["off"])
        assert set(cpu["us_per_chunk"]) == {"off", "on"}
    assert isinstance(out["meets_targets"], bool)
