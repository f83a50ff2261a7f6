"""What a profile is: `ProfileFamily` (how one canonical instrument is exposed: its Prometheus name, which
dimensions become labels and under what names, coarser buckets, a scale) and `Profile` (a server
dialect's families and base labels). The dialects themselves are `vllm`, `otel`, `sglang`, `tgi`
and `triton`; `profiles` picks one by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from otel_llm.canonical import instruments as I

LabelMap = dict[str, tuple[str, Callable[[str], str | None]]]  # dim -> (label, value map; None drops)


def same(v: str) -> str:
    return v


@dataclass(frozen=True)
class ProfileFamily:
    """How one canonical instrument is exposed in a profile."""

    canonical: str
    name: str  # family name; counters get `_total` on their sample
    labels: LabelMap = field(default_factory=dict)
    buckets: tuple[float, ...] | None = None  # in the family's unit; None: the canonical buckets
    scale: float = 1.0  # exposed value = canonical value x scale (Triton: seconds -> us or ms)
    part: str | None = None  # "sum" | "count": a histogram's sum or count, exposed as a counter
    const: tuple[tuple[str, str], ...] = ()  # fixed labels, after the base ones
    only: dict[str, tuple[str, ...]] = field(default_factory=dict)  # dim -> the values whose series count
    help: str | None = None  # None: the canonical description; "": no HELP line (names a server never describes)
    # A gauge valued from the cache config: the product of these entries (Triton's block size:
    # ("block_size",)); canonical is CACHE_CONFIG_INFO; the series is left out while an entry is not a number.
    cache_key: tuple[str, ...] = ()
    # (label, Source field) pairs replacing the profile's base labels (vLLM's frontend counters have no engine)
    base: tuple[tuple[str, str], ...] | None = None

    @property
    def canonical_buckets(self) -> tuple[float, ...] | None:
        """The family's bounds in the canonical unit (what aggregation must include)."""
        if self.buckets is None:
            return None
        return self.buckets if self.scale == 1.0 else tuple(b / self.scale for b in self.buckets)

    def kind(self, inst: I.Instrument) -> I.Kind:
        return I.Kind.COUNTER if self.part else inst.kind


@dataclass(frozen=True)
class Profile:
    name: str
    model_label: str
    engine_label: str
    families: tuple[ProfileFamily, ...]
    emit_empty: bool  # vLLM pre-creates every labelled child; OTel exports only series with data
    base: tuple[tuple[str, str], ...] | None = None  # (label, Source field); None: model and engine
    counter_suffix: str = "_total"  # "" where the server's client library adds none (Rust, C++)
    openmetrics: bool = True  # False: always text 0.0.4, as the server (its counters keep their names)
    # vLLM-Omni: the engine label reshaped into `stage` + `replica` (Source.stage, Source.replica)
    stage_replica: bool = False

    @property
    def base_labels(self) -> tuple[tuple[str, str], ...]:
        if self.base is not None:
            return self.base
        if self.stage_replica:
            return ((self.model_label, "model"), ("stage", "stage"), ("replica", "replica"))
        return ((self.model_label, "model"), (self.engine_label, "engine"))


def with_custom(fams: list[ProfileFamily], custom: dict[str, tuple[float, ...]]) -> tuple[ProfileFamily, ...]:
    """The families with the operator's buckets (`custom_buckets.resolve`) where given."""
    return tuple(replace(f, buckets=custom[f.canonical]) if f.canonical in custom and not f.part else f
                 for f in fams)
