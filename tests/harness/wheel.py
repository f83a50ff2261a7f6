"""The otel-llm wheel, built from this checkout as a user's `pip install .` would build it.

`source_digest()` names the sources the wheel is made of (pyproject.toml and the three package
folders), so a venv that installed the wheel can tell when it is stale; `build_wheel()` builds it
once per digest into ``REPO/.cache/wheels/<digest>/`` with the project venv's setuptools (no
download), and returns the ``.whl``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("otel_llm", "collector", "server")


def source_digest() -> str:
    h = hashlib.sha256((REPO / "pyproject.toml").read_bytes())
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def build_wheel() -> Path:
    out = REPO / ".cache/wheels" / source_digest()
    wheels = sorted(out.glob("otel_llm-*.whl"))
    if wheels:
        return wheels[0]
    shutil.rmtree(REPO / "build", ignore_errors=True)  # setuptools' staging folder: stale modules would go in
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(REPO)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the wheel failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                           f"{proc.stderr[-3000:]}")
    return next(out.glob("otel_llm-*.whl"))
