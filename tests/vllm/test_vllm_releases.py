"""otel-llm's plugin in every vLLM release this machine kind runs: PyPI's CPU builds 0.27.1 to 0.32.0.

The newest (0.32.0) is test_vllm_plugin.py's. The oldest (0.27.1) gets the same two equality checks:
in `add` mode, after a mixed load (chat and completions, streamed or not, n=2, an aborted stream, a
refused request) the OTLP totals the collector received equal vLLM's own `/metrics`; in `replace`
mode, vLLM's families (types, labels, buckets) and counts equal what its own logger served for the
same deterministic load. Every release in between is loaded, records and exports: the same `add`
mode equality: with `OTEL_LLM_VLLM_MATRIX=1` (`make test-vllm-matrix` sets it; about 5 minutes,
which would take the default suite past 20), else skipped, saying so. Each release runs in its own
venv (uv, files shared by hard links; built in the background while the rest of the suite runs,
see conftest.py).
"""

from __future__ import annotations

import os
import time

import pytest

from otel_llm.vllm.compat import RUN_CHECKED
from tests.vllm.harness import DEFAULT_VERSION, VllmServer, ensure_tiny_model, ensure_vllm_venv
from tests.vllm.workload import (assert_every_sample_served, assert_same_families_and_counts, assert_totals_equal,
                                 deterministic_load, hostile_load, idle_and_caught_up, samples, start_collector,
                                 wait_idle)

pytestmark = pytest.mark.slow
OLDEST = RUN_CHECKED[0]
BETWEEN = tuple(v for v in RUN_CHECKED[1:] if v != DEFAULT_VERSION)
MATRIX = os.environ.get("OTEL_LLM_VLLM_MATRIX", "").strip() in ("1", "yes", "true")


def add_mode_run(version: str) -> dict:
    """vLLM `version` in add mode pushing every 500 ms to a collector, after the mixed load."""
    ensure_vllm_venv(version=version)
    model = ensure_tiny_model()
    collector = start_collector()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.http}", "OTEL_METRIC_EXPORT_INTERVAL": "500",
           "OTEL_LLM_VLLM_METRICS": None, "VLLM_PLUGINS": None}
    try:
        with VllmServer(model, env=env, version=version) as server:
            answers, _ = deterministic_load(server.url)
            deterministic = wait_idle(server.url)
            hostile_load(server.url)
            time.sleep(1.0)
            text, got = idle_and_caught_up(server.url, collector.prom)
            return {"answers": answers, "deterministic": deterministic, "vllm": text, "collector": got,
                    "log": server.log_text()}
    finally:
        collector.proc.terminate()
        collector.proc.wait(10)


def assert_loaded_cleanly(log: str, mode: str) -> None:
    assert "otel_llm -> otel_llm.vllm.plugin:StatLogger" in log
    assert f"otel-llm stat logger ({mode} mode, API server 0 of 1)" in log, log[-3000:]
    assert "Traceback" not in log and "Failed to load plugin" not in log
    # no fallback taken, no release warning: this release is in the checked range
    assert "otel-llm: on vLLM" not in log and "which otel-llm does not aggregate" not in log
    assert "otel-llm: vLLM" not in log


@pytest.fixture(scope="module")
def oldest_add():
    return add_mode_run(OLDEST)


@pytest.fixture(scope="module")
def oldest_replace(oldest_add):
    env = {"OTEL_LLM_VLLM_METRICS": "replace", "OTEL_METRICS_EXPORTER": "none", "VLLM_PLUGINS": None}
    with VllmServer(ensure_tiny_model(), env=env, version=OLDEST) as server:
        answers, _ = deterministic_load(server.url)
        return {"answers": answers, "text": wait_idle(server.url), "log": server.log_text()}


def test_the_oldest_release_pushes_exactly_what_it_serves(oldest_add):
    assert_loaded_cleanly(oldest_add["log"], "add")
    assert_totals_equal(samples(oldest_add["vllm"]), oldest_add["collector"])
    assert_every_sample_served(samples(oldest_add["vllm"]), oldest_add["collector"])


def test_the_oldest_release_in_replace_mode_serves_its_own_families_and_counts(oldest_add, oldest_replace):
    assert_loaded_cleanly(oldest_replace["log"], "replace")
    assert oldest_replace["answers"] == oldest_add["answers"]
    ours = assert_same_families_and_counts(oldest_add["deterministic"], oldest_replace["text"])
    assert "vllm:request_num_preemptions" not in ours  # what 0.27.1 does not have is not served (vLLM 0.30 on)


@pytest.mark.skipif(not MATRIX, reason="the releases between the oldest and the newest run with OTEL_LLM_VLLM_MATRIX=1 "
                                       "(make test-vllm-matrix)")
@pytest.mark.parametrize("version", BETWEEN)
def test_every_release_in_between_loads_records_and_exports_exactly(version):
    run = add_mode_run(version)
    assert_loaded_cleanly(run["log"], "add")
    assert_totals_equal(samples(run["vllm"]), run["collector"])
    assert len(run["answers"]) == 9  # the deterministic load's requests all answered (n=2 counts twice in vLLM)
    assert sum(v for (n, _), v in samples(run["vllm"]).items() if n == "vllm:request_success_total") >= 10
