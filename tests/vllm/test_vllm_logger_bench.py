"""benchmarks/vllm_logger_bench.py runs in the vLLM venv and prints one JSON object (a short run).

Timings are the benchmark's business (a 20-step run on a shared 2-core machine proves no ratio); the
test checks that it runs, reports every case, and that what it timed computed vLLM's exact samples."""

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
    assert set(report["cases"]) == {"decode_64", "decode_256", "jitter_256", "many_64", "one_64"}
    for case in report["cases"].values():
        assert set(case) == {"vllm", "otel_llm_replace", "vllm_plus_otel_llm_add"}
    assert report["same_samples_as_vllm"] is True  # the timed replace logger rendered vLLM's own values
    for case in report["cases"].values():
        assert all(v > 0 for entry in case.values() for v in entry.values())
    assert set(report["ratios_vllm_over_replace"]) == {
        "per_token_decode_64", "per_token_decode_256", "per_token_decode_256_jittered_itl", "per_finished_many_64", "per_finished_one_per_step_64",
        "metrics_render"}
