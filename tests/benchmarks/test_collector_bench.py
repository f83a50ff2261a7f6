"""benchmarks/collector_bench.py keeps working: a short run on a small fleet prints consistent JSON
(the figures themselves are measured by running it, never asserted here)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "collector_bench.py"


def test_quick_run_counts_every_point_it_sent():
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--servers", "4", "--batch", "2",
                           "--senders", "3", "--e2e-seconds", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["points_per_export"] >= 40  # every family of the vllm profile
    for run, per_request in (("ingest_http", 1), ("ingest_http_3_senders", 1), ("ingest_http_batched", 2),
                             ("ingest_grpc", 1), ("ingest_grpc_3_senders", 1), ("ingest_grpc_batched", 2)):
        r = result[run]
        assert r["points"] == r["requests"] * per_request * result["points_per_export"], run
        assert r["points_per_cpu_s"] > 0 and 0 < r["collector_busy"] <= 2.5
    assert result["scrape"]["series"] == 4 * result["points_per_export"] and result["scrape"]["text_lines"] > result["scrape"]["series"]
    assert result["targets_met"]["scrape_50_servers_20ms"] is False  # 4 servers are not the target's fleet
    assert isinstance(result["targets_met"]["ingest_grpc_single_exports_200k_per_cpu_s"], bool)
    assert "end_to_end" not in result
