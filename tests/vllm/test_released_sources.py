"""The plugin against the source of every vLLM release from 0.11 to 0.33, read from the released wheels.

Only 0.27.1-0.32.0 run here (PyPI's CPU builds; test_vllm_releases.py); the others are read: each
release's metrics, stats and plugin-loading files come from its wheel on PyPI (`released_source`,
range requests, cached under .cache/vllm-sources), parsed, never imported. Checked against the
plugin's own source (otel_llm/vllm/*.py, parsed too): every vLLM module, class, method, keyword and
stats field it relies on exists in every release that loads plugins, or the plugin reads it with a
fallback (`otel_llm.vllm.compat`); every family a release declares gets values in `replace` mode
without vLLM's own per-step code; and what a release observes where releases differ is what the
plugin folds. A change to the plugin that one release would not survive fails here, not in a
user's vLLM.
"""

from __future__ import annotations

import ast
import concurrent.futures
import re
from pathlib import Path

import pytest

from otel_llm.shim.profiles import get_profile
from otel_llm.vllm import compat
from tests.vllm.released_source import released_files

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "otel_llm/vllm"
# every `vllm` release on PyPI from 0.11.0 to 0.33.0
RELEASES = ("0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0",
            "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0",
            "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0",
            "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
LOADING = tuple(v for v in RELEASES if compat.parse_version(v) >= compat.FIRST)
LOGGERS, STATS = "vllm/v1/metrics/loggers.py", "vllm/v1/metrics/stats.py"
HELPERS = ("vllm/v1/spec_decode/metrics.py", "vllm/distributed/kv_transfer/kv_connector/v1/metrics.py",
           "vllm/distributed/ec_transfer/ec_connector/metrics.py", "vllm/v1/metrics/perf.py")
FILES = (LOGGERS, STATS, *HELPERS, "vllm/plugins/__init__.py", "vllm/v1/engine/async_llm.py")
STATS_CLASSES = ("IterationStats", "FinishedRequestStats", "SchedulerStats", "PromptTokenStats", "PrefixCacheStats",
                 "BaseCacheStats", "MultiModalCacheStats", "SpecDecodingStats", "KVCacheEvictionEvent")


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


PLUGIN = {p.name: _parse(p) for p in sorted(PLUGIN_DIR.glob("*.py"))}


def _module_imports() -> dict[str, set[str]]:
    """{vllm module path in a wheel: names} the plugin imports at module level (what vLLM's loader runs)."""
    out: dict[str, set[str]] = {}
    for tree in PLUGIN.values():
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                out.setdefault(node.module.replace(".", "/") + ".py", set()).update(a.name for a in node.names)
    return out


@pytest.fixture(scope="module")
def releases() -> dict[str, dict[str, str | None]]:
    """{release: {path: source or None}}, fetched 8 at a time (cached after the first run)."""
    paths = sorted(set(FILES) | set(_module_imports()))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        texts = pool.map(lambda v: released_files("vllm", v, paths), RELEASES)
        return dict(zip(RELEASES, texts))


class Classes:
    """The classes of some source files: per class its fields (annotations, `self.x =`), class
    attributes, methods with their parameters, and the class's AST."""

    def __init__(self, *sources: str | None) -> None:
        self.nodes: dict[str, ast.ClassDef] = {}
        self.defined: set[str] = set()  # every top-level name (classes, functions, assignments, imports)
        for src in sources:
            if src is None:
                continue
            tree = ast.parse(src)
            for node in tree.body:
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.defined.add(node.name)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    self.defined.update((a.asname or a.name).split(".")[0] for a in node.names)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    self.defined.update(t.id for t in targets if isinstance(t, ast.Name))
            self.nodes.update({n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)})

    def members(self, cls: str) -> set[str]:
        node = self.nodes.get(cls)
        if node is None:
            return set()
        out = set()
        for b in node.body:
            if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                out.add(b.target.id)
            elif isinstance(b, ast.Assign):
                out.update(t.id for t in b.targets if isinstance(t, ast.Name))
            elif isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.add(b.name)
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and \
                    isinstance(n.value, ast.Name) and n.value.id == "self":
                out.add(n.attr)
        return out

    def method(self, cls: str, name: str) -> ast.FunctionDef | None:
        node = self.nodes.get(cls)
        return next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == name), None) if node else None


def _guarded(*trees: ast.Module) -> set[str]:
    """Names the plugin reads with a fallback: `getattr(x, "name", ...)` / `hasattr(x, "name")`, and the
    strings of a module-level tuple looped over with getattr/hasattr (`hasattr(x, f) for f in TUPLE`)."""
    out = set()
    for tree in trees:
        tuples = {t.id: {e.value for e in ast.walk(n.value) if isinstance(e, ast.Constant)}
                  for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple)
                  for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr") \
                    and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant):
                out.add(n.args[1].value)
            loops = n.generators if isinstance(n, (ast.GeneratorExp, ast.ListComp)) else \
                [n] if isinstance(n, ast.For) else []
            if loops and re.search(r"\b(getattr|hasattr)\(", ast.unparse(n)):
                out.update(*(tuples.get(getattr(g.iter, "id", ""), ()) for g in loops))
    return out


def _direct_reads(tree: ast.Module, receiver_self: bool) -> set[str]:
    """Attribute names read off objects (`x.name`; `self.name` when receiver_self) and `attrgetter` fields."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            is_self = isinstance(n.value, ast.Name) and n.value.id == "self"
            if is_self == receiver_self:
                out.add(n.attr)
        elif not receiver_self and isinstance(n, ast.Call) and getattr(n.func, "id", "") == "attrgetter":
            out.update(a.value for a in n.args if isinstance(a, ast.Constant))
    return out


def _problems(found: list[str]) -> None:
    assert found == [], "\n".join(found)


def test_every_release_from_0_11_1_loads_stat_logger_plugins_and_0_11_0_does_not(releases):
    for v, files in releases.items():
        loads = "load_stat_logger_plugin_factories()" in (files["vllm/v1/engine/async_llm.py"] or "")
        assert loads == (v in LOADING), v
        if loads:
            assert '"vllm.stat_logger_plugins"' in files["vllm/plugins/__init__.py"] + files[LOGGERS], v
    assert compat.serving_note("0.11.0") and not compat.serving_note("0.11.1") and not compat.serving_note("0.33.0")


def test_what_the_plugin_imports_at_module_level_exists_in_every_release(releases):
    found = []
    for v in LOADING:
        for path, names in _module_imports().items():
            text = releases[v][path]
            missing = names if text is None else names - Classes(text).defined
            found += [f"vLLM {v}: {path} has no {n}" for n in sorted(missing)]
    _problems(found)


def _ours(kind: type, name: str):
    """The plugin's class or function of that name (plugin.py)."""
    return next(n for n in ast.walk(PLUGIN["plugin.py"]) if isinstance(n, kind) and n.name == name)


def _our_params(cls: str, method: str) -> list[str]:
    fn = next(b for b in _ours(ast.ClassDef, cls).body if isinstance(b, ast.FunctionDef) and b.name == method)
    return [a.arg for a in fn.args.args[1:]]


def test_vllm_constructs_and_calls_the_plugin_with_the_names_it_takes(releases):
    """The keywords and positional counts of every call StatLoggerManager makes on its loggers."""
    ours = ("OtelLLMStatLogger", "OtelLLMPrometheusStatLogger")
    found = []
    for v in LOADING:
        manager = Classes(releases[v][LOGGERS]).nodes["StatLoggerManager"]
        for call in (n for n in ast.walk(manager) if isinstance(n, ast.Call)):
            keywords = [k.arg for k in call.keywords]
            if isinstance(call.func, ast.Name) and call.func.id[0].islower() and "vllm_config" in keywords:
                method = "__init__"  # a plugin's factory (its class), not one of vLLM's own classes
            elif isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and \
                    call.func.value.id in ("stat_logger", "logger") and call.func.attr.startswith(("record", "log")):
                method = call.func.attr
            else:
                continue
            for cls in ours:
                if method not in {b.name for b in _ours(ast.ClassDef, cls).body if isinstance(b, ast.FunctionDef)}:
                    if method.startswith("record_") and cls == "OtelLLMStatLogger":
                        continue  # vLLM's base class's no-op
                    found.append(f"vLLM {v} calls {method}() on {cls}, which does not define it")
                    continue
                params = _our_params(cls, method)
                if len(call.args) > len(params) or set(keywords) - set(params):
                    found.append(f"vLLM {v} calls {cls}.{method}({len(call.args)} positional, {keywords}); "
                                 f"it takes {params}")
    _problems(found)


def test_every_stats_field_the_plugin_reads_without_a_fallback_exists_in_every_release(releases):
    """A field read directly (`x.field`, `attrgetter("field")`) is in each release's class that has it in
    any release; a field some release lacks is read with getattr/hasattr or listed in compat.STATS_DEFAULTS."""
    per_release = {v: Classes(releases[v][STATS], *(releases[v][h] for h in HELPERS)) for v in LOADING}
    owners: dict[str, set[str]] = {}  # field -> the stats classes that have it in some release
    for classes in per_release.values():
        for cls in STATS_CLASSES:
            for f in classes.members(cls):
                owners.setdefault(f, set()).add(cls)
    trees = (PLUGIN["stats.py"], PLUGIN["plugin.py"])
    reads = set().union(*(_direct_reads(t, receiver_self=False) for t in trees)) - _guarded(*trees)
    found = []
    for f in sorted(reads & set(owners)):
        for v, classes in per_release.items():
            present = [c for c in owners[f] if c in classes.nodes]
            if present and not any(f in classes.members(c) for c in present):
                found.append(f"vLLM {v}: no {'/'.join(sorted(present))}.{f}, which the plugin reads directly")
    _problems(found)
    # the documented fallbacks are real: each field is missing from some release, and read with a fallback
    for key in compat.STATS_DEFAULTS:
        cls, f = key.split(".")
        assert any(f not in per_release[v].members(cls) for v in LOADING), key
        assert f in _guarded(*trees), key


def test_the_logger_attributes_the_plugin_reads_exist_in_every_release(releases):
    per_release = {v: Classes(releases[v][LOGGERS]) for v in LOADING}
    members = {v: c.members("PrometheusStatLogger") | c.members("AggregateStatLoggerBase") |
               c.members("StatLoggerBase") for v, c in per_release.items()}
    every = set().union(*members.values())
    replace = _ours(ast.ClassDef, "OtelLLMPrometheusStatLogger")
    ours = {b.name for b in replace.body if isinstance(b, ast.FunctionDef)} | \
        {n.attr for n in ast.walk(replace) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    reads = (_direct_reads(ast.Module(body=[replace], type_ignores=[]), receiver_self=True) & every) - ours - \
        _guarded(PLUGIN["plugin.py"])
    _problems([f"vLLM {v}: PrometheusStatLogger has no {a}, which the plugin reads"
               for v in LOADING for a in sorted(reads - members[v])])


def _declared_families(files: dict[str, str | None]) -> set[str]:
    """The `vllm:*` names a release's loggers and metric helpers declare (as written: a counter's
    `_total` is dropped by prometheus_client, a histogram's is its name)."""
    out = set()
    for path in (LOGGERS, *HELPERS):
        if files[path] is None:
            continue
        for n in ast.walk(ast.parse(files[path])):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"vllm:[a-z0-9_]+", n.value):
                out.add(n.value)
    return out


def _extras_families() -> set[str]:
    """The keys of the `extras` dict in the plugin's `_install_sources` (families with an aggregated value)."""
    d = next(n.value for n in ast.walk(_ours(ast.FunctionDef, "_install_sources"))
             if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "extras")
    return {k.value for k in d.keys}


def test_every_family_a_release_declares_gets_values_in_replace_mode_without_vllms_per_step_code(releases):
    sourced = {f.name for f in get_profile("vllm").families} | set(compat.ALIASES) | _extras_families()
    found = []
    for v in LOADING:
        for name in sorted(_declared_families(releases[v])):
            bare = name.removesuffix("_total")
            if not {name, bare} & sourced and not compat.vllm_filled(bare):
                found.append(f"vLLM {v} declares {name}: replace mode would fall back to vLLM's own record()")
    _problems(found)
    assert "vllm:time_per_output_token_seconds" in _declared_families(releases["0.14.1"])  # aliases in use
    assert "vllm:gpu_cache_usage_perc" in _declared_families(releases["0.11.1"])
    for old, same in compat.ALIASES.items():  # an alias has the same labels and buckets as its family
        text = releases["0.11.1"][LOGGERS]
        assert old in text and same in text


def test_every_metric_helper_class_declares_through_the_class_attributes_the_plugin_replaces(releases):
    """`PrometheusStatLogger._*_cls` (spec decode, KV/EC connectors, MFU): each helper declares its families
    through `_counter_cls`/`_gauge_cls`/`_histogram_cls`, so in replace mode they land on otel-llm's shims
    (compat.helper_classes finds them by those attributes)."""
    found = []
    for v in LOADING:
        classes = Classes(releases[v][LOGGERS], *(releases[v][h] for h in HELPERS))
        prom = classes.nodes["PrometheusStatLogger"]
        for b in prom.body:
            if isinstance(b, ast.Assign) and isinstance(b.targets[0], ast.Name) and \
                    re.fullmatch(r"_\w+_cls", b.targets[0].id) and isinstance(b.value, ast.Name):
                attr, helper = b.targets[0].id, b.value.id
                if attr in ("_counter_cls", "_gauge_cls", "_histogram_cls"):
                    continue
                declared = classes.members(helper) & {"_counter_cls", "_gauge_cls", "_histogram_cls"}
                if helper not in classes.nodes or not declared:
                    found.append(f"vLLM {v}: {attr} = {helper} declares no _counter_cls/_gauge_cls/_histogram_cls")
    _problems(found)


def test_what_iteration_tokens_observes_in_each_release_is_what_the_plugin_folds(releases):
    for v in LOADING:
        prom = Classes(releases[v][LOGGERS]).method("PrometheusStatLogger", "record")
        [call] = [n for n in ast.walk(prom) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
                  n.func.attr == "observe" and "histogram_iteration_tokens" in ast.unparse(n.func.value)]
        computed = "prompt_token_stats.computed" in ast.unparse(call.args[0])
        assert computed == (compat.parse_version(v) >= compat.STEP_TOKENS_COMPUTED_FROM), (v, ast.unparse(call))
