"""The wheel a user installs: one import name (`otel_llm`), every source file in it, lean base
dependencies with the rest in extras, and the two entry points."""

import zipfile
from email.parser import Parser

import pytest

from tests.harness.wheel import REPO, build_wheel

# What only the collector, the server or the timeline need: never in the base install.
NOT_BASE = {"cramjam", "pyyaml", "torch", "fastapi", "uvicorn", "matplotlib", "httpx", "openai", "pydantic",
            "opentelemetry-exporter-prometheus", "prometheus-fastapi-instrumentator", "tokenizers", "gguf"}
MAPPED = {"otel_llm": "otel_llm", "collector": "otel_llm/collector", "server": "otel_llm/server"}


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    with zipfile.ZipFile(build_wheel()) as whl:
        yield whl


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


def _requirement_name(line: str) -> str:
    name = line.split(";")[0].strip()
    for stop in "<>=!~[ (":
        name = name.split(stop)[0]
    return name.lower().replace("_", "-")


def test_the_wheel_installs_only_the_otel_llm_import_name(wheel):
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"otel_llm"}


def test_every_source_file_is_in_the_wheel_under_otel_llm(wheel):
    names = set(wheel.namelist())
    expected = {f"{MAPPED[folder]}/{path.relative_to(REPO / folder).as_posix()}"
                for folder in MAPPED for path in (REPO / folder).rglob("*")
                if path.is_file() and path.suffix in (".py", ".html", ".js", ".css") and "__pycache__" not in path.parts}
    assert expected - names == set()
    assert "otel_llm/collector/extension/ui/index.html" in names
    assert {n for n in names if n.endswith(".py")} - expected == set()  # nothing from elsewhere (tests, benchmarks)


def test_base_dependencies_are_lean_and_the_rest_are_extras(wheel):
    meta = Parser().parsestr(_dist_info(wheel, "METADATA"))
    requires = meta.get_all("Requires-Dist")
    base = {_requirement_name(r) for r in requires if "extra ==" not in r}
    assert base & NOT_BASE == set()
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp", "numpy", "prometheus-client"} <= base
    assert {"collector", "serve", "timeline", "all", "test"} <= set(meta.get_all("Provides-Extra"))

    def extra(name: str) -> set[str]:
        return {_requirement_name(r) for r in requires if f'extra == "{name}"' in r}

    assert {"cramjam", "pyyaml", "grpcio"} <= extra("collector")
    assert {"torch", "fastapi", "uvicorn"} <= extra("serve")
    assert extra("timeline") == {"matplotlib"}
    assert meta["License-Expression"] == "Apache-2.0"


def test_the_command_and_the_vllm_plugin_are_entry_points(wheel):
    text = _dist_info(wheel, "entry_points.txt")
    assert "[console_scripts]\notel-llm = otel_llm.cli:main" in text
    assert "[vllm.stat_logger_plugins]\notel_llm = otel_llm.vllm.plugin:StatLogger" in text
