"""Online serving benchmark for the otel-llm server: see `benchmarks/serving/cli.py` (`--help`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.serving.cli import main  # noqa: E402 (after the path is set)

if __name__ == "__main__":
    sys.exit(main())
