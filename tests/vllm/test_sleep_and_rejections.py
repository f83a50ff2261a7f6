"""record_sleep_state and record_admission_rejection as vLLM's StatLoggerManager calls them, on vLLM 0.32's real
classes (the CPU build has no sleep mode and no queue limits to trigger them through `vllm serve`): after
every call, replace mode renders exactly what vLLM's own PrometheusStatLogger does; nothing ever raises."""

import json
import subprocess

import pytest

from tests.vllm.harness import REPO, VLLM_PY, ensure_tiny_model, ensure_vllm_venv

pytestmark = pytest.mark.slow


def test_sleep_states_and_admission_rejections_render_as_vllms_own():
    ensure_vllm_venv()
    out = subprocess.run([str(VLLM_PY), "tests/vllm/sleep_and_rejections.py", str(ensure_tiny_model())], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout)
    assert len(report["steps"]) == 7
    for step in report["steps"]:
        assert step["same"], step
    last = report["steps"][-1]["otel_llm"]
    assert sorted(v for k, v in last.items() if "admission_rejections_total" in k) == [1.0, 2.0]
    states = {k: v for k, v in report["steps"][2]["otel_llm"].items() if "engine_sleep_state" in k}
    assert [k for k, v in states.items() if v == 1.0] == [k for k in states if "weights_offloaded" in k]  # level 1
    assert report["unknown_reason_counted"] == 1 and report["add_mode_errors"] == 0
