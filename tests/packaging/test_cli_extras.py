"""`otel-llm` on a base install (`pip install otel-llm`, no extras): every subcommand prints its
help, and one that needs an extra ends with one line naming it (exit 2), never a traceback.

The base install is simulated by an import hook that refuses every module an extra brings (and
what those pull in), so the checks run in the project's venv."""

import subprocess
import sys

import pytest

from otel_llm.cli import EXTRA_MODULES

REFUSED = sorted({m for modules in EXTRA_MODULES.values() for m in modules} | {"pydantic", "starlette", "anyio"})
BASE_INSTALL = f"""
import sys
REFUSED = {REFUSED!r}
class RefuseExtras:
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in REFUSED):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, RefuseExtras())
"""


def otel_llm(*args: str) -> subprocess.CompletedProcess:
    code = BASE_INSTALL + "from otel_llm.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", [[], ["serve"], ["serve-pipeline"], ["demo"], ["collector"], ["timeline"], ["slo"],
                                     ["slo", "rules"]])
def test_every_subcommand_prints_its_help_without_extras(command):
    done = otel_llm(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: otel-llm {' '.join(command)}".rstrip())
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command, extra, module", [
    (["serve", "--model", "dummy"], "serve", "torch"),
    (["serve-pipeline"], "serve", "torch"),
    (["demo"], "serve", "torch"),
    (["collector", "--otlp-http-port", "0"], "collector", "grpc"),
    (["collector", "--print-otelcol-config"], "collector", "grpc"),
    (["slo", "rules", "--config", "slo.yaml"], "slo", "yaml"),
])
def test_a_missing_extra_is_named_in_one_line(command, extra, module):
    done = otel_llm(*command)
    assert done.returncode == 2
    assert done.stderr == (f"otel-llm {command[0]}: error: needs the '{extra}' extra (module '{module}' is "
                           f"missing); install it with: pip install 'otel-llm[{extra}]'\n")


def test_the_timeline_names_its_extra_only_to_draw(tmp_path):
    drawn = otel_llm("timeline", "--trace-store", str(tmp_path), "--out", str(tmp_path / "t.png"))
    assert drawn.returncode == 2
    assert "pip install 'otel-llm[timeline]'" in drawn.stderr and "Traceback" not in drawn.stderr
    exported = otel_llm("timeline", "--trace-store", str(tmp_path), "--jaeger-json", str(tmp_path / "t.json"))
    assert exported.returncode == 2 and "no trace store in" in exported.stderr  # got past the extra check


def test_the_version():
    done = otel_llm("--version")
    assert done.returncode == 0 and done.stdout == "otel-llm 0.1.0\n"


def test_the_sdk_imports_without_any_extra():
    code = BASE_INSTALL + """
import otel_llm, otel_llm.export.asgi, otel_llm.export.exposition, otel_llm.frontend.stat_logger, otel_llm.cli
from otel_llm import Telemetry, TelemetryConfig
loaded = sorted(m for m in sys.modules if any(m == r or m.startswith(r + ".") for r in REFUSED))
print(loaded)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"
