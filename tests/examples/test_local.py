"""examples/local end to end: three real servers -> the collector -> a real Prometheus scraping it and
another receiving its remote-write, and every request's trace in the collector's store; and a mixed
fleet with a real vLLM pushing through otel-llm's plugin."""

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
def test_a_mixed_fleet_real_vllm_with_the_plugin_beside_an_otel_llm_server(tmp_path):
    """`--vllm`: a real, unmodified vLLM with otel-llm's plugin (pushing over OTLP, its spans given
    phases) and an otel-llm server (pushing) read through one profile in a real Prometheus: per job and
    instance, what each server's own /metrics says."""
    proc = subprocess.run([sys.executable, "examples/local/run_local.py", "--servers", "1", "--requests", "3",
                           "--vllm", "--workdir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{\n"):proc.stdout.rindex("}") + 1])
    own, per_instance = report["own_metrics"], report["scrape"]["per_instance"]
    assert report["vllm_metrics_path"] == "otel-llm plugin (OTLP push)"
    assert own["vllm"] == 3 and own["servers"] == [3]
    assert sorted(per_instance.values()) == [3, 3]  # vLLM's instance is its service.instance.id
    assert report["scrape"]["sum_request_success_total"] == 6
    assert report["vllm_traces_with_phases"] == 3 and report["traces_stored"] == 3
    assert "scraping" not in (tmp_path / "collector.log").read_text()  # pushed, not scraped
    vllm_log = (tmp_path / "vllm.log").read_text()
    assert "otel-llm stat logger (add mode, API server 0 of 1): OTLP push (cumulative, every 1 s) to http://127.0.0.1:" \
        in vllm_log
