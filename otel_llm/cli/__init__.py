"""`otel-llm`: one command, a subcommand per component, each defined in its component's package.

- `serve`, `serve-pipeline`, `demo`: `otel_llm.server.cli` (the `serve` extra);
- `collector`: `otel_llm.collector.cli` (the `collector` extra);
- `timeline`: `otel_llm.collector.timeline.cli` (the `timeline` extra to draw a PNG);
- `slo`: `otel_llm.slo.cli` (the `slo` extra: PyYAML).

Building the parser imports only the standard library and the SDK's light modules, so every
subcommand prints its `--help` on a base install (`pip install otel-llm`). Before a subcommand
runs, the modules of the extra it needs are looked up; a missing one ends the command with one
line naming the extra to install (exit code 2), not a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys

from otel_llm import __version__

# The import names each extra of the distribution brings (pyproject.toml's optional-dependencies).
EXTRA_MODULES = {
    "serve": ("torch", "fastapi", "uvicorn", "httpx", "tokenizers", "jinja2", "gguf", "safetensors", "openai",
              "prometheus_fastapi_instrumentator"),
    "collector": ("grpc", "google.rpc", "cramjam", "yaml", "hpack"),
    "timeline": ("matplotlib",),
    "slo": ("yaml",),
}
_COMPONENTS = ("otel_llm.server.cli", "otel_llm.collector.cli", "otel_llm.collector.timeline.cli", "otel_llm.slo.cli")


def missing_module(extra: str) -> str | None:
    """The first module of `extra` that cannot be imported, else None."""
    for module in EXTRA_MODULES[extra]:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except ModuleNotFoundError:  # a parent package is missing
            return module
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-llm", description="OpenTelemetry-first observability for LLM serving: the reference server, "
                                     "the collector and the request timeline",
        epilog="`otel-llm COMMAND --help` describes each command.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMPONENTS:
        importlib.import_module(name).add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Each subcommand's parser sets `run` (its entry, taking the parsed args) and `extras`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for extra in args.extras:
        module = missing_module(extra)
        if module is not None:
            print(f"otel-llm {args.command}: error: needs the '{extra}' extra (module {module!r} is missing); "
                  f"install it with: pip install 'otel-llm[{extra}]'", file=sys.stderr)
            return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(args, parser)
