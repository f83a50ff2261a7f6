"""benchmarks/vllm_logger_bench.py runs in the vLLM venv and prints one JSON object (a short run)."""

import json
import subprocess

import pytest

from tests.vllm.harness import REPO, VLLM_PY, ensure_tiny_model, ensure_vllm_venv

pytestmark = pytest.mark.slow


def test_the_benchmark_prints_its_json():
    ensure_vllm_venv()
    model = ensure_tiny_model()
    out = subprocess.run([str(VLLM_PY), "benchmarks/vllm_logger_bench.py", "--model-dir", str(model), "--steps", "20",
                          "--rounds", "1"], cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout)
    assert set(report["cases"]) == {"decode_64", "decode_256", "many_64", "one_64"}
    for case in report["cases"].values():
        assert set(case) == {"vllm", "otel_llm_replace", "vllm_plus_otel_llm_add"}
    r = report["ratios_vllm_over_replace"]
    assert r["per_finished_many_64"] > 1 and r["metrics_render"] > 1  # far from the targets' 5x if broken
