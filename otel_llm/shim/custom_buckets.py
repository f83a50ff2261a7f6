"""`--custom-histogram-buckets`: bucket bounds chosen by the operator, per histogram family.

A spec names what it overrides in one of three ways:
- a vLLM bucket family key (`request_latency`, `time_to_first_token`, ...; vLLM's
  `ObservabilityConfig.custom_histogram_buckets`): every histogram of that family;
- a vLLM metric name (`vllm:e2e_request_latency_seconds`): that histogram only;
- a canonical instrument name (`gen_ai.server.request.duration`).
It is written `NAME=b1,b2,...` (repeatable) or as vLLM's JSON object
`{"request_latency": [0.01, 0.05]}`. Bounds must be numbers, finite, positive and
strictly increasing (vLLM's rules); a bad spec raises ValueError naming it.

The result maps canonical instruments to bounds. They replace the canonical (OTLP)
bounds and the `vllm` and `otel` profiles' buckets, so the exposition and the
OTLP export change alike; the other profiles keep the buckets of the server they
copy (SGLang, TGI and Triton have their own flags for that).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

# vLLM's bucket families (vllm/v1/metrics/buckets.py) -> the canonical instruments using them.
BUCKET_FAMILIES = {
    "request_latency": ("gen_ai.server.request.duration", "otel_llm.request.queue.duration",
                        "otel_llm.request.inference.duration", "otel_llm.request.prefill.duration",
                        "otel_llm.request.decode.duration"),
    "time_to_first_token": ("gen_ai.server.time_to_first_token",),
    "inter_token_latency": ("otel_llm.request.inter_token_latency", "gen_ai.server.time_per_output_token"),
    "iteration_tokens": ("otel_llm.step.tokens",),
    "request_params_n": ("otel_llm.request.params.n",),
    "request_num_preemptions": ("otel_llm.request.preemptions",),
    "request_tokens": ("otel_llm.request.prompt_tokens", "otel_llm.request.generation_tokens",
                       "otel_llm.request.max_generation_tokens", "otel_llm.request.params.max_tokens",
                       "otel_llm.request.prefill_kv_computed_tokens"),
    "kv_cache_residency": ("otel_llm.kv_block.lifetime", "otel_llm.kv_block.idle_before_evict",
                           "otel_llm.kv_block.reuse_gap"),
}


def parse_specs(specs: Iterable[str]) -> dict[str, tuple[float, ...]]:
    """`NAME=b1,b2,...` strings (or one vLLM JSON object each) -> {name: bounds}, validated."""
    out: dict[str, tuple[float, ...]] = {}
    for spec in specs:
        spec = spec.strip()
        if spec.startswith("{"):
            try:
                obj = json.loads(spec)
            except json.JSONDecodeError as e:
                raise ValueError(f"--custom-histogram-buckets {spec!r}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"--custom-histogram-buckets {spec!r}: expected a JSON object")
            items = list(obj.items())
        else:
            name, sep, values = spec.partition("=")
            if not sep or not name.strip():
                raise ValueError(f"--custom-histogram-buckets {spec!r}: expected NAME=b1,b2,...")
            items = [(name.strip(), values.split(","))]
        for name, values in items:
            out[name] = validate(name, values)
    return out


def validate(name: str, values) -> tuple[float, ...]:
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"--custom-histogram-buckets {name}: expected a non-empty list of bounds")
    bounds = []
    for v in values:
        if isinstance(v, bool):
            raise ValueError(f"--custom-histogram-buckets {name}: bound {v!r} must be a number, not a boolean")
        try:
            b = float(v.strip() if isinstance(v, str) else v)
        except (TypeError, ValueError):
            raise ValueError(f"--custom-histogram-buckets {name}: bound {v!r} is not a number") from None
        if not math.isfinite(b) or b <= 0:
            raise ValueError(f"--custom-histogram-buckets {name}: bound {v!r} must be finite and positive")
        if bounds and b <= bounds[-1]:
            raise ValueError(f"--custom-histogram-buckets {name}: bounds must be strictly increasing "
                             f"({bounds[-1]!r} then {b!r})")
        bounds.append(b)
    return tuple(bounds)


def resolve(overrides: dict[str, tuple[float, ...]], vllm_names: dict[str, str],
            histograms: Iterable[str]) -> dict[str, tuple[float, ...]]:
    """{bucket family | vLLM name | canonical name: bounds} -> {canonical histogram: bounds}.
    `vllm_names`: vLLM family name -> canonical name. A more specific name wins over a family key."""
    histograms = set(histograms)
    out: dict[str, tuple[float, ...]] = {}
    specific: dict[str, tuple[float, ...]] = {}
    for name, bounds in overrides.items():
        if name in BUCKET_FAMILIES:
            out.update((c, bounds) for c in BUCKET_FAMILIES[name])
        elif vllm_names.get(name) in histograms:
            specific[vllm_names[name]] = bounds
        elif name in histograms:
            specific[name] = bounds
        else:
            known = sorted(BUCKET_FAMILIES) + sorted(n for n, c in vllm_names.items() if c in histograms)
            raise ValueError(f"--custom-histogram-buckets {name}: not a histogram family; expected a vLLM "
                             f"bucket family, a vLLM histogram or a canonical histogram name: {', '.join(known)}")
    out.update(specific)
    return out
