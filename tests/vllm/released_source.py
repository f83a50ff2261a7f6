"""Python files of a released vLLM, read from its wheel on PyPI without installing or importing it.

A vLLM wheel is 130-440 MB; the plugin's check needs a dozen of its files. A wheel is a zip, and
PyPI answers HTTP range requests: `released_files("vllm", "0.20.1", [...])` reads the zip's central
directory from the end of the file, then only the members asked for (a few hundred KB in all), and
keeps them under ``REPO/.cache/vllm-sources/<dist>-<version>/`` (a release never changes, so the
second run reads the disk). A server that ignores ranges gets the whole wheel downloaded once.
Standard library only. `OTEL_LLM_PYPI_JSON` overrides the JSON API's base (``https://pypi.org/pypi``).
"""

from __future__ import annotations

import json
import os
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache/vllm-sources"
ATTEMPTS = 4
_EOCD = b"PK\x05\x06"
_EOCD64 = b"PK\x06\x06"


def _pypi_json_base() -> str:
    return os.environ.get("OTEL_LLM_PYPI_JSON", "https://pypi.org/pypi").rstrip("/")


def _get(url: str, first: int | None = None, last: int | None = None) -> tuple[bytes, bool]:
    """GET url (bytes first..last inclusive, or from -first to the end when last is None and
    first < 0); (body, whether the server honoured the range). Retried with back-off."""
    headers = {"User-Agent": "otel-llm-tests"}
    if first is not None:
        headers["Range"] = f"bytes={first}-" if first < 0 or last is None else f"bytes={first}-{last}"
        if first < 0:
            headers["Range"] = f"bytes={first}"
    for attempt in range(ATTEMPTS):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as r:
                return r.read(), r.status == 206
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            if attempt == ATTEMPTS - 1 or (isinstance(exc, urllib.error.HTTPError) and exc.code == 404):
                raise RuntimeError(f"GET {url} failed: {exc}") from exc
            time.sleep(2 * 2**attempt)
    raise AssertionError("unreachable")


def wheel_url(dist: str, version: str) -> str:
    """The URL of the release's linux x86_64 wheel (its Python files are the same on every platform)."""
    api = f"{_pypi_json_base()}/{dist}/json"
    files = json.loads(_get(api)[0])["releases"].get(version) or []
    wheels = [f for f in files if f["filename"].endswith(".whl") and "x86_64" in f["filename"]] or \
        [f for f in files if f["filename"].endswith(".whl")]
    if not wheels:
        raise RuntimeError(f"{dist} {version}: no wheel on {api}")
    return urllib.parse.urljoin(api, wheels[0]["url"])


def _zip64_sizes(extra: bytes, usize: int, csize: int, local: int) -> tuple[int, int, int]:
    """A central-directory entry's zip64 extended information (header 0x0001) applied."""
    pos = 0
    while pos + 4 <= len(extra):
        hid, size = struct.unpack("<HH", extra[pos:pos + 4])
        if hid == 1:
            vals = list(struct.unpack(f"<{size // 8}Q", extra[pos + 4:pos + 4 + size // 8 * 8]))
            usize = vals.pop(0) if usize == 0xFFFFFFFF else usize
            csize = vals.pop(0) if csize == 0xFFFFFFFF else csize
            local = vals.pop(0) if local == 0xFFFFFFFF else local
            break
        pos += 4 + size
    return usize, csize, local


class _RemoteZip:
    """The members of a zip read through range requests (or the whole file when ranges are ignored)."""

    def __init__(self, url: str) -> None:
        self.url, self.whole = url, None
        tail, ranged = _get(url, -(1 << 16))
        if not ranged:
            self.whole, tail = tail, tail
        self.entries = self._central_directory(tail)

    def _read(self, offset: int, size: int) -> bytes:
        if self.whole is not None:
            return self.whole[offset:offset + size]
        return _get(self.url, offset, offset + size - 1)[0]

    def _central_directory(self, tail: bytes) -> dict[str, tuple[int, int, int]]:
        at = tail.rfind(_EOCD)
        if at < 0:
            raise RuntimeError(f"{self.url}: no end of central directory in the last 64 KiB")
        count, size, offset = struct.unpack("<HII", tail[at + 10:at + 20])
        if offset == 0xFFFFFFFF or count == 0xFFFF:  # zip64: the record before the locator
            z = tail.rfind(_EOCD64)
            count, size, offset = struct.unpack("<QQQ", tail[z + 32:z + 56])
        cd = self._read(offset, size)
        entries, pos = {}, 0
        for _ in range(count):
            method, csize, usize = struct.unpack("<H8xII", cd[pos + 10:pos + 28])
            nlen, xlen, clen = struct.unpack("<HHH", cd[pos + 28:pos + 34])
            local = struct.unpack("<I", cd[pos + 42:pos + 46])[0]
            name = cd[pos + 46:pos + 46 + nlen].decode()
            extra = cd[pos + 46 + nlen:pos + 46 + nlen + xlen]
            if 0xFFFFFFFF in (csize, usize, local):
                usize, csize, local = _zip64_sizes(extra, usize, csize, local)
            entries[name] = (local, csize, method)
            pos += 46 + nlen + xlen + clen
        return entries

    def read(self, name: str) -> bytes:
        local, csize, method = self.entries[name]
        head = self._read(local, 30)
        nlen, xlen = struct.unpack("<HH", head[26:30])
        data = self._read(local + 30 + nlen + xlen, csize) if csize else b""
        return zlib.decompress(data, -15) if method == 8 else data


def released_files(dist: str, version: str, paths: list[str]) -> dict[str, str | None]:
    """{path: source text, or None when the release has no such file} for paths inside the wheel."""
    folder = CACHE / f"{dist}-{version}"
    index = folder / "index.json"
    known = json.loads(index.read_text()) if index.is_file() else {}
    missing = [p for p in paths if p not in known]
    if missing:
        z = _RemoteZip(wheel_url(dist, version))
        for p in missing:
            if p in z.entries:
                target = folder / p
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(p))
                known[p] = True
            else:
                known[p] = False
        folder.mkdir(parents=True, exist_ok=True)
        tmp = index.with_suffix(".tmp")
        tmp.write_text(json.dumps(known, indent=0, sort_keys=True))
        tmp.replace(index)
    return {p: (folder / p).read_text() if known[p] else None for p in paths}
