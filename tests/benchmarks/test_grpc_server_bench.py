"""benchmarks/grpc_server_bench.py keeps working: a short run serves every installed candidate and prints
consistent JSON (the figures themselves are measured by running it, never asserted here)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "grpc_server_bench.py"
WORKLOADS = {"empty_c1", "empty_c8", "decode_c1", "decode_c8", "decode_batched_c1"}


def test_quick_run_measures_every_installed_candidate_and_skips_the_others():
    done = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["points_per_export"] >= 40 and result["export_bytes"] > 0  # every family of the vllm profile
    candidates = result["candidates"]
    assert set(candidates) == {"otel_llm_h2", "grpcio_sync", "grpcio_aio", "grpclib", "grpclib_uvloop"}
    measured = [name for name, c in candidates.items() if "runs" in c]
    assert {"otel_llm_h2", "grpcio_sync", "grpcio_aio"} <= set(measured)  # the collector's dependencies
    for name, candidate in candidates.items():
        if name not in measured:
            assert candidate == {"skipped": "not installed"}
            continue
        assert set(candidate["runs"]) == WORKLOADS and candidate["version"]
        for workload, run in candidate["runs"].items():
            assert run["requests"] > 0 and run["cpu_s"] > 0, (name, workload)
            assert run["cpu_us_per_request"] > 0 and run["points_per_cpu_s"] > 0, (name, workload)
            assert run["ratio_vs_grpcio_sync"] > 0, (name, workload)
    assert all(run["ratio_vs_grpcio_sync"] == 1.0 for run in candidates["grpcio_sync"]["runs"].values())
    assert sorted(result["ranking"]) == sorted(measured)
    assert all(isinstance(v, bool) for v in result["targets_met"].values())
