"""The Prometheus families the released vLLM-Omni declares, read from its wheel on PyPI without
importing it (it needs vLLM): `pip download --no-deps vllm-omni==VERSION` once into
``.cache/vllm-omni`` (beside the vLLM venvs' caches), then the `prometheus_client` constructor calls
of ``vllm_omni/metrics/*.py`` evaluated from their syntax tree, names and buckets resolved through
``definitions.py``'s module constants."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

VERSION = "0.30.0"
REPO = Path(__file__).resolve().parents[3]
CACHE = REPO / ".cache" / "vllm-omni"
_FILES = ("prometheus.py", "modality.py", "transfer.py", "realtime.py")
_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}
# prometheus_client's Histogram.DEFAULT_BUCKETS (a histogram declared without buckets), +Inf left out
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class ReleasedFamily(NamedTuple):
    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...]  # histograms only, +Inf left out


def wheel() -> Path:
    """The release's wheel, downloaded from PyPI the first time."""
    found = sorted(CACHE.glob(f"vllm_omni-{VERSION}-*.whl"))
    if not found:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
                        f"vllm-omni=={VERSION}", "-d", str(CACHE)], check=True, timeout=600)
        found = sorted(CACHE.glob(f"vllm_omni-{VERSION}-*.whl"))
    return found[0]


class _Namespace(dict):
    """A module's evaluated constants, reachable as attributes (``defs.X``)."""


def _value(node: ast.AST, env: dict):
    """The value of a constant expression: literals, tuples, lists, +, names, ``defs.X``, f-strings of
    those, ``list(...)``/``tuple(...)``; ValueError for anything else."""
    match node:
        case ast.Constant(value=v):
            return v
        case ast.Tuple(elts=items) | ast.List(elts=items):
            return tuple(_value(i, env) for i in items)
        case ast.BinOp(left=a, op=ast.Add(), right=b):
            return _value(a, env) + _value(b, env)
        case ast.Name(id=name) if name in env:
            return env[name]
        case ast.Attribute(value=ast.Name(id=module), attr=attr) if isinstance(env.get(module), _Namespace):
            return env[module][attr]
        case ast.JoinedStr(values=parts):
            return "".join(str(_value(p.value if isinstance(p, ast.FormattedValue) else p, env)) for p in parts)
        case ast.Call(func=ast.Name(id="list" | "tuple"), args=[arg]):
            return tuple(_value(arg, env))
    raise ValueError(ast.dump(node)[:80])


def _constants(tree: ast.Module, env: dict) -> dict:
    """`env` plus every module-level assignment of a constant expression (in order)."""
    env = dict(env)
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            try:
                value = _value(stmt.value, env)
            except (ValueError, KeyError, TypeError):
                continue
            for t in targets:
                if isinstance(t, ast.Name):
                    env[t.id] = value
    return env


def families() -> dict[str, ReleasedFamily]:
    """Every family the release's metrics modules declare, by exposed name (counters without `_total`)."""
    with zipfile.ZipFile(wheel()) as whl:
        text = {name: whl.read(f"vllm_omni/metrics/{name}").decode() for name in ("definitions.py", *_FILES)}
    defs = _Namespace(_constants(ast.parse(text["definitions.py"]), {}))
    out: dict[str, ReleasedFamily] = {}
    for name in _FILES:
        tree = ast.parse(text[name])
        env = _constants(tree, {"defs": defs})
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _KINDS:
                args = [_value(a, env) for a in node.args]
                kw = {k.arg: _value(k.value, env) for k in node.keywords if k.arg}
                fam_name, doc = (args + [kw.get("name"), kw.get("documentation")])[:2] if len(args) >= 2 else \
                    (kw.get("name", args[0] if args else None), kw.get("documentation"))
                kind = _KINDS[node.func.id]
                buckets = tuple(float(b) for b in kw.get("buckets", DEFAULT_BUCKETS) if b != float("inf")) \
                    if kind == "histogram" else ()
                out[fam_name] = ReleasedFamily(fam_name, kind, doc, tuple(kw.get("labelnames", ())), buckets)
    return out
