"""argparse types shared by the `otel-llm` subcommands: numbers in a range, each failing with
the value and the range it missed (argparse prints it and exits 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_in(low: int, high: int | None = None, name: str = "value") -> Callable[[str], int]:
    """An int in [low, high] (no upper bound when `high` is None)."""
    rule = f">= {low}" if high is None else f"in {low}..{high}"

    def parse(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"invalid {name} {text!r}: must be {rule}")
        return value

    parse.__name__ = "int" if name == "value" else name  # argparse's word for a text that is no int
    return parse


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be > 0")
    return value


positive_float.__name__ = "positive number"
positive_int = int_in(1)
positive_int.__name__ = "positive int"
port = int_in(0, 65535, "port")
