"""`benchmarks/serve_bench.py`'s pieces, one noun per module: the workload, the load client, the
summary of a load, /metrics fidelity, the servers it starts, the span receiver, time slicing, the
telemetry on/off comparison, and the command line (`cli`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    """Progress, on stderr (stdout carries the JSON)."""
    print(f"[serve_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
