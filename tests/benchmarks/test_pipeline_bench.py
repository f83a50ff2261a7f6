"""pipeline_bench, one small round on the CPU model and one on the accelerator-like one: both servers
served every request, the stats-on server's counts were exact, and the JSON carries the figures the
README quotes (ratios and server CPU per token) and the configuration they were measured in."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("model_args, model, null_step_ms, max_num_seqs", [
    ([], "dummy", None, None),
    (["--model", "null", "--null-step-ms", "5", "--max-num-seqs", "3"], "null", 5.0, 3),
])
def test_one_round_prints_valid_figures(model_args, model, null_step_ms, max_num_seqs):
    run = subprocess.run([sys.executable, "benchmarks/pipeline_bench.py", "--repeats", "1", "--num-requests", "12",
                          "--concurrency", "4", "--max-tokens", "8", "--slice", "0.1", *model_args],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert (out["model"], out["null_step_ms"], out["max_num_seqs"]) == (model, null_step_ms, max_num_seqs)
    assert out["valid"] and out["failed_requests"] == 0 and out["counts_exact_every_round"]
    assert len(out["throughput_ratio_per_round"]) == 1 and out["throughput_ratio_on_vs_off"] > 0
    assert set(out["tok_s_per_round"]) == {"off", "on"}
    # the null engine's few steps may round to no CPU ticks at all
    for proc in ("api", "engine") if model == "dummy" else ("api",):
        cpu = out["server_cpu_us_per_token"][proc]
        assert cpu["off"] > 0 and cpu["on"] > 0 and cpu["ratio_on_vs_off"] == pytest.approx(cpu["on"] / cpu["off"])
        assert set(cpu["us_per_chunk"]) == {"off", "on"}
    assert isinstance(out["meets_targets"], bool)


def test_null_step_needs_the_null_model():
    run = subprocess.run([sys.executable, "benchmarks/pipeline_bench.py", "--null-step-ms", "5"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--null-step-ms needs --model null" in run.stderr
