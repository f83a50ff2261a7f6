"""Builds the vLLM venvs in the background while the rest of the suite runs.

When the session collected tests under tests/vllm, one daemon thread builds (or checks) the venv of
every release the tests will run (the default, the oldest, and with OTEL_LLM_VLLM_MATRIX=1 the
ones in between), the default first, and the tiny model: by the time these tests start
(they run last) the venvs are ready. A test that needs a venv the thread is still building waits on
the build's file lock; a build that failed is reported by the first test that needs it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from otel_llm.vllm.compat import RUN_CHECKED
from tests.vllm import harness
from tests.vllm.test_vllm_releases import MATRIX

HERE = Path(__file__).resolve().parent


def _prebuild() -> None:
    wanted = RUN_CHECKED if MATRIX else (RUN_CHECKED[0],)  # the oldest always; the rest with the matrix
    for version in (harness.DEFAULT_VERSION, *(v for v in wanted if v != harness.DEFAULT_VERSION)):
        try:
            harness.ensure_vllm_venv(progress=lambda line: None, version=version)
            if version == harness.DEFAULT_VERSION:
                harness.ensure_tiny_model()
        except Exception:  # the test that needs it reports the failure (its build is not retried)
            continue


def pytest_collection_finish(session) -> None:
    if any(Path(str(item.fspath)).resolve().is_relative_to(HERE) and item.get_closest_marker("slow")
           for item in session.items):
        threading.Thread(target=_prebuild, name="vllm-venvs", daemon=True).start()
