"""A pipeline stage's engine: (stage, replica) in place of vLLM's `engine` label (vLLM-Omni).

vLLM-Omni runs several engines (stages x replicas) in one process and reshapes each engine's
upstream `vllm:*` families from `{model_name, engine}` to `{model_name, stage, replica}`. Here
that is a profile option, not a fork of the family table: a `Telemetry` whose
`TelemetryConfig.stage_replica` is set renders under `Profile.stage_replica`, whose base
labels read `Source.stage` and `Source.replica`. Several such Telemetries render into one
exposition (`asgi.make_metrics_app`), each family once; nothing is registered anywhere, so
there is no duplicate registration to work around.
"""

from __future__ import annotations


def check_stage_replica(value) -> tuple[str, str] | None:
    """A valid `TelemetryConfig.stage_replica` (None, or two non-empty strings), else ValueError naming it."""
    if value is None:
        return None
    if (not isinstance(value, tuple) or len(value) != 2
            or not all(isinstance(v, str) and v for v in value)):
        raise ValueError(f"stage_replica must be None or a (stage, replica) pair of non-empty strings, got {value!r}")
    return value
