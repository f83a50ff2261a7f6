"""The SDK's public surface, pinned: what `otel_llm` exports, the few modules the README and the
examples import, and the parts of the SDK the collector may use (the shim, the canonical
instruments, export; never a private name)."""

import ast
import importlib
import re
from pathlib import Path

import otel_llm

REPO = Path(__file__).resolve().parents[2]
PUBLIC = {
    "otel_llm": {"EventKind", "FinishReason", "RequestInfo", "SchedulerSnapshot", "StepRecord", "StepRecorder",
                 "Telemetry", "TelemetryConfig", "__version__"},
    "otel_llm.pipeline": {"PipelineConfig", "PipelineStatLogger", "PipelineTelemetry", "SnapshotThrottle",
                          "TransferHop"},
    "otel_llm.export.asgi": {"make_metrics_app"},
    "otel_llm.export.otlp_metrics": {"otlp_metric_reader", "service_resource"},
}
# the SDK's tables (instruments, profiles, the pipeline's families), exposition and CLI helpers
COLLECTOR_MAY_USE = ("otel_llm.shim.", "otel_llm.canonical.", "otel_llm.export.", "otel_llm.cli.",
                     "otel_llm.pipeline.families")


def _imports(source: str) -> list[tuple[str, str]]:
    """(module, name) of every `from otel_llm... import name` in Python source."""
    return [(node.module, alias.name) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("otel_llm") for alias in node.names]


def test_the_package_exports_exactly_the_pinned_names():
    assert set(otel_llm.__all__) | {"__version__"} == PUBLIC["otel_llm"]


def test_every_pinned_name_imports():
    for module, names in PUBLIC.items():
        mod = importlib.import_module(module)
        assert {n for n in names if not hasattr(mod, n)} == set(), module


def test_the_readme_and_the_examples_import_only_the_public_surface():
    sources = [p.read_text() for p in (REPO / "examples").rglob("*.py")]
    sources += re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    used = {pair for source in sources for pair in _imports(source)}
    assert used, "no SDK import found: the check would pass vacuously"
    assert {(m, n) for m, n in used if n not in PUBLIC.get(m, ())} == set()


def test_the_collector_uses_only_the_sdks_shim_canonical_and_export_surface():
    used = {(path.relative_to(REPO).as_posix(), module, name)
            for path in (REPO / "collector").rglob("*.py") for module, name in _imports(path.read_text())
            if not module.startswith("otel_llm.collector")}
    assert used
    allowed = {u for u in used if u[1].startswith(COLLECTOR_MAY_USE) and not u[2].startswith("_")}
    assert used - allowed == {(path, "otel_llm", "__version__") for path, module, name in used
                              if (module, name) == ("otel_llm", "__version__")}
