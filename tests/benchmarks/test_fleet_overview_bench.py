"""benchmarks/fleet_overview_bench.py keeps working: a small store prints consistent JSON (the figures
themselves are measured by running it, never asserted here)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_overview_bench.py"


def test_a_small_run_counts_every_request_it_stored():
    done = subprocess.run([sys.executable, str(BENCH), "--requests", "2000", "--repeats", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["fill"]["spans"] == 2000 * 5
    queries = result["queries"]
    assert len(queries) == 8 and all(q["bytes"] > 0 and q["cells"] > 0 for q in queries.values())
    assert result["targets_met"]["every_request_counted"] is True
    assert queries["heatmap_1h_ttft_one_service"]["requests"] == 1000  # the services take turns by batch
