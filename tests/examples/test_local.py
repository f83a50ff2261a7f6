"""examples/local end to end: three real servers -> the collector -> a real Prometheus scraping it and
another receiving its remote-write, and every request's trace in the collector's store."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_local_stack_counts_every_request_exactly(tmp_path):
    proc = subprocess.run([sys.executable, "examples/local/run_local.py", "--servers", "3", "--requests", "4",
                           "--remote-write", "--workdir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])
    assert report["requests_sent"] == 12
    for role in ("scrape", "remote_write"):
        assert report[role]["sum_request_success_total"] == 12
        assert sorted(report[role]["per_instance"].values()) == [4, 4, 4]
        assert len(set(report[role]["per_instance"])) == 3
        assert report[role]["ttft_p50_s"] is not None and report[role]["ttft_p50_s"] > 0
    assert report["scrape"]["per_instance"] == report["remote_write"]["per_instance"]
    assert report["traces_stored"] == 12  # every request's trace, kept by the collector
    assert "honor_labels" in (tmp_path / "prometheus.yml").read_text()
    assert json.loads((tmp_path / "prometheus-remote-write.yml").read_text())["scrape_configs"] == []


@pytest.mark.slow
def test_a_mixed_fleet_real_vllm_scraped_beside_an_otel_llm_server(tmp_path):
    """`--vllm`: a real, unmodified vLLM (scraped, its spans given phases) and an otel-llm server (pushing)
    read through one profile in a real Prometheus: per instance, what each server's own /metrics says."""
    proc = subprocess.run([sys.executable, "examples/local/run_local.py", "--servers", "1", "--requests", "3",
                           "--vllm", "--workdir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{\n"):proc.stdout.rindex("}") + 1])
    own, per_instance = report["own_metrics"], report["scrape"]["per_instance"]
    [vllm_instance] = [k for k in own if k != "servers"]
    assert own[vllm_instance] == per_instance[vllm_instance] == 3  # vLLM: instance is its host:port
    assert sorted(v for k, v in per_instance.items() if k != vllm_instance) == own["servers"] == [3]
    assert report["scrape"]["sum_request_success_total"] == 6
    assert report["vllm_traces_with_phases"] == 3 and report["traces_stored"] == 3
    assert f"scraping http://{vllm_instance}/metrics every 1s (job vllm)" in (tmp_path / "collector.log").read_text()
