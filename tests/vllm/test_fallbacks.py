"""The replace-mode logger on a vLLM unlike any checked release (vLLM 0.32's real classes, patched in
`fallbacks.py` as a newer release might differ): a family otel-llm has never seen is filled by vLLM's
own code, named in one WARNING, and the exposition equals vLLM's own; a constructor that fails on
otel-llm's classes leaves vLLM's own logger serving (one WARNING) while the OTLP side still counts."""

import json
import subprocess

import pytest

from tests.vllm.harness import REPO, VLLM_PY, ensure_tiny_model, ensure_vllm_venv

pytestmark = pytest.mark.slow


def run(scenario: str) -> dict:
    ensure_vllm_venv()
    out = subprocess.run([str(VLLM_PY), "tests/vllm/fallbacks.py", str(ensure_tiny_model()), scenario], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_a_family_otel_llm_has_never_seen_is_filled_by_vllms_code_and_named_once():
    report = run("future-family")
    assert report["serving"] and report["vllm_records"]
    [warning] = report["warnings"]
    assert "declares vllm:future_steps, which otel-llm does not aggregate" in warning and "vLLM 0.32.0" in warning
    assert report["same_as_vllm"]  # every family, the new one included, as vLLM's own logger serves it
    [line] = report["served_future_steps"]  # one per step (40), recorded by vLLM's own code on our classes
    assert 'engine="0"' in line and line.endswith("} 40.0"), line
    assert report["otlp_finished"] == report["finished"] == 320 and report["errors"] == 0


def test_a_constructor_failing_on_otel_llms_classes_leaves_vllms_own_logger_serving():
    report = run("constructor-fails")
    assert not report["serving"]
    [warning] = report["warnings"]
    assert warning.startswith("otel-llm: on vLLM 0.32.0, serving vLLM's families from otel-llm's aggregation "
                              "(replace mode); vLLM's own logger serves them and otel-llm pushes OTLP alongside")
    assert "TypeError: __new__() got an unexpected keyword argument" in warning
    assert report["vllm_success"] == report["finished"] == 320  # vLLM's own families, recorded
    assert report["otlp_finished"] == 320 and report["errors"] == 0  # and the OTLP side, from the same steps
