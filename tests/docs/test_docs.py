"""The documentation: the MkDocs site builds with no warning (a broken link, anchor or snippet fails
it), every Python block a reader would paste is a file under docs_src/ that runs, the README's Python
blocks are excerpts of those files, and the README stays a front page with the two fresh-machine
commands."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.packaging.test_public_surface import PUBLIC, _imports

REPO = Path(__file__).resolve().parents[2]
DOCS, DOCS_SRC, README = REPO / "docs", REPO / "docs_src", REPO / "README.md"
SNIPPET = re.compile(r'^--8<-- "(?P<path>docs_src/[\w./-]+\.py)(?::(?P<section>[a-z][-_0-9a-z]*))?"$')
SECTION_MARKER = re.compile(r"^\s*# --8<-- \[(start|end):[a-z][-_0-9a-z]*\]\s*$")
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S)
README_MAX_LINES = 250


def _clean_env() -> dict[str, str]:
    """The environment without OTEL_* settings, so a docs_src file or a build sees no exporter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["NO_MKDOCS_2_WARNING"] = "1"  # mkdocs-material's banner about MkDocs 2.0 (not a build warning)
    return env


def mkdocs_build(config: Path, site_dir: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config` with this venv's mkdocs."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site_dir)], cwd=config.parent, env=_clean_env(),
                          capture_output=True, text=True, timeout=300)


def _warnings(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if re.match(r"^(WARNING|ERROR)\b", line)]


def test_the_site_builds_strict_with_no_warning(tmp_path):
    done = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0 and _warnings(done) == [], done.stdout + done.stderr
    sdk = (tmp_path / "site" / "sdk" / "index.html").read_text()
    assert "end_step_bytes" in sdk  # the docs_src file was included, not left as `--8<--`
    assert "--8&lt;--" not in "".join(p.read_text() for p in (tmp_path / "site").rglob("*.html"))


@pytest.mark.parametrize(("breakage", "reason"), [
    ("[a broken anchor](sdk.md#no-such-heading)", "does not contain an anchor '#no-such-heading'"),
    ("[a broken page link](no-such-page.md)", "'no-such-page.md'"),
    ('```python\n--8<-- "docs_src/no_such_file.py"\n```', "docs_src/no_such_file.py' could not be found"),
], ids=["anchor", "page", "snippet"])
def test_a_broken_link_anchor_or_snippet_fails_the_build(tmp_path, breakage, reason):
    """The strict build is what catches them: a copy of the site with one breakage must fail."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copytree(DOCS_SRC, tmp_path / "docs_src")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n" + breakage + "\n")
    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and reason in done.stdout + done.stderr, done.stdout + done.stderr


def _docs_src_files() -> list[Path]:
    return sorted(DOCS_SRC.glob("*.py"))


def _as_params(paths: list[Path]) -> list:
    """One param per file; a file that starts a server subprocess is `slow`, as other such tests are."""
    return [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if "subprocess" in p.read_text() else [])
            for p in paths]


@pytest.mark.parametrize("path", _as_params(_docs_src_files()))
def test_every_docs_src_file_runs(path):
    done = subprocess.run([sys.executable, str(path.relative_to(REPO))], cwd=REPO, env=_clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _python_blocks(text: str) -> list[tuple[int, str]]:
    """(index of the fence's first character, body) of every ```python block."""
    return [(m.start(), m.group("body")) for m in FENCE.finditer(text) if m.group("lang") == "python"]


def test_every_python_block_of_the_site_is_a_docs_src_file():
    included = set()
    for page in sorted(DOCS.rglob("*.md")):
        for _, body in _python_blocks(page.read_text()):
            match = SNIPPET.match(body.strip())
            assert match and "\n" not in body.strip(), \
                f"{page.relative_to(REPO)}: a python block must be one `--8<-- \"docs_src/NAME.py\"` line:\n{body}"
            target = REPO / match.group("path")
            assert target.is_file(), f"{page.relative_to(REPO)}: {match.group('path')} does not exist"
            if match.group("section"):
                assert f"[start:{match.group('section')}]" in target.read_text()
            included.add(target)
    assert included, "no python block found: the check would pass vacuously"
    readme_files = {REPO / name for name in _readme_blocks()}
    assert set(_docs_src_files()) - included - readme_files == set(), "docs_src files no page shows"


def _readme_blocks() -> dict[str, str]:
    """{docs_src path: body} of the README's python blocks, each named by a `<!-- docs_src/NAME.py -->`
    comment on the line just above its fence."""
    text = README.read_text()
    out = {}
    for start, body in _python_blocks(text):
        above = text[:start].rstrip("\n").rsplit("\n", 1)[-1]
        name = re.fullmatch(r"<!-- (docs_src/[\w./-]+\.py) -->", above.strip())
        assert name, f"README python block without a `<!-- docs_src/NAME.py -->` line above it:\n{body}"
        out[name.group(1)] = body
    return out


def test_readme_python_blocks_are_excerpts_of_the_docs_src_files_they_name():
    blocks = _readme_blocks()
    assert blocks, "the README has no python block: the check would pass vacuously"
    for name, body in blocks.items():
        source = [line for line in (REPO / name).read_text().splitlines() if not SECTION_MARKER.match(line)]
        excerpt = body.rstrip("\n").splitlines()
        n = len(excerpt)
        assert any(source[i:i + n] == excerpt for i in range(len(source) - n + 1)), \
            f"README's block naming {name} is not a contiguous excerpt of it: copy it again from the file"


def test_docs_src_imports_only_the_public_surface():
    used = {pair for path in _docs_src_files() for pair in _imports(path.read_text())}
    assert used
    assert {(m, n) for m, n in used if n not in PUBLIC.get(m, ())} == set()


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_readme_fresh_machine_section_has_exactly_the_two_commands():
    text = README.read_text()
    section = re.search(r"^## Fresh machine: the two commands\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, "README.md has no '## Fresh machine: the two commands' section"
    blocks = list(FENCE.finditer(section.group(1)))
    assert len(blocks) == 1 and blocks[0].group("lang") == "bash", "one bash block in the section"
    commands = [line.split("#", 1)[0].strip() for line in blocks[0].group("body").splitlines()]
    assert [c for c in commands if c] == ["make serve", "make test"]
    assert all("#" in line for line in blocks[0].group("body").splitlines()), "each command keeps its explanation"


def test_readme_links_point_to_files_that_exist():
    """GitHub renders the README, not MkDocs: its relative links are checked here."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    relative = [t for t in targets if not re.match(r"^[a-z]+:", t)]
    assert relative, "no relative link found: the check would pass vacuously"
    assert [t for t in relative if not (REPO / t).exists()] == []
