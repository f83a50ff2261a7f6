"""The source tree's shape: imports use only the installed name (`otel_llm...`, never the
folders `collector`/`server` as top-level packages), and a package's modules import one another
without circles (at any depth: imports inside functions count)."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = {"otel_llm": "otel_llm", "collector": "otel_llm.collector", "server": "otel_llm.server"}


def _modules() -> dict[str, Path]:
    """Every module of the distribution, by its installed dotted name."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The distribution's modules that `path` imports (a name imported from a package that is a
    module of it counts as that module); `if TYPE_CHECKING:` imports are for annotations only."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test).endswith("TYPE_CHECKING") for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                out.add(child if child in modules else base)
    return out & modules.keys()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_nothing_imports_the_folders_as_top_level_packages():
    offenders = []
    for path in REPO.rglob("*.py"):
        parts = path.relative_to(REPO).parts
        if "build" in parts or any(p.startswith(".") for p in parts):  # venvs, caches, .git
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                          if n.split(".")[0] in ("collector", "server")]
    assert offenders == []


def _graph(package: str, leave_out: tuple[str, ...] = ()) -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imported(path, name, modules) if m != name}
            for name, path in modules.items() if (name == package or name.startswith(package + "."))
            and not any(name.startswith(out) for out in leave_out)}


@pytest.mark.parametrize("package", ["otel_llm.collector", "otel_llm.server", "otel_llm"])
def test_no_import_circles(package):
    assert _cycles(_graph(package)) == []


LONG_FILE_LINES = 320  # "about 300": past it a module says why it is one file (a "Size:" paragraph)


def test_a_long_module_says_why_it_is_one_file():
    unexplained = []
    for path in _modules().values():
        text = path.read_text()
        if len(text.splitlines()) > LONG_FILE_LINES and "Size:" not in (ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(REPO)} ({len(text.splitlines())} lines)")
    assert unexplained == []
