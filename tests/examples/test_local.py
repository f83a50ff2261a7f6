"""examples/local end to end: two real servers -> the collector -> a real Prometheus."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_local_stack_counts_every_request_exactly(tmp_path):
    proc = subprocess.run([sys.executable, "examples/local/run_local.py", "--servers", "2", "--requests", "5",
                           "--workdir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])
    assert report["sum_request_success_total"] == 10 and report["requests_sent"] == 10
    assert sorted(report["per_instance"].values()) == [5, 5] and len(set(report["per_instance"])) == 2
    assert report["ttft_p50_s"] is not None and report["ttft_p50_s"] > 0
    assert "honor_labels" in (tmp_path / "prometheus.yml").read_text()
