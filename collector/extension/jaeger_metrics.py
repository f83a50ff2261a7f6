"""Jaeger's Service Performance Monitoring endpoints (the UI's Monitor tab), answered from the
trace store's per-minute span counts (`tracestore.span_metrics`) instead of a Prometheus.

``GET /api/metrics/{latencies,calls,errors}?service=&quantile=&groupByOperation=&endTs=&lookback=
&step=&ratePer=&spanKind=`` (times in ms; defaults now, 1 h, 5 s, 10 min; ``service`` repeatable and
required; ``spanKind`` repeatable, default ``server``; ``quantile`` required for latencies), as
Jaeger's HTTP handler and its Prometheus metrics reader answer them: one ``MetricFamily`` (not the
envelope), ``service_latencies`` (ms), ``service_call_rate`` (per second), ``service_error_rate``
(a fraction of the calls) or their ``service_operation_*`` forms with an ``operation`` label, one
series per service (and operation) with points every ``step``; bad parameters raise ValueError
with Jaeger's wording (the caller answers 400).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from otel_llm.collector.extension.go_values import parse_bool, query_param
from otel_llm.collector.tracestore.store import TraceStore

METRICS = ("latencies", "calls", "errors")
_KINDS = {"unspecified": 0, "internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}
_NAMES = {"latencies": "latencies", "calls": "call_rate", "errors": "error_rate"}
_HELP = {"calls": "calls/sec", "errors": "error rate, computed as a fraction of errors/sec over calls/sec"}


def metric_family(store: TraceStore, metric: str, params: dict[str, list[str]]) -> dict:
    services = [s for s in params.get("service", []) if s]
    if not services:
        raise ValueError("unable to parse param 'service': please provide at least one service name")
    kinds = []
    for kind in params.get("spanKind", []) or ["server"]:
        if kind not in _KINDS:
            raise ValueError(f"unable to parse param 'spanKind': unsupported span kind: '{kind}'")
        kinds.append(_KINDS[kind])
    quantile = 0.0
    if metric == "latencies":
        text = query_param(params, "quantile")
        try:
            quantile = float(text)
        except ValueError:
            raise ValueError(f"unable to parse param 'quantile': strconv.ParseFloat: parsing \"{text}\": "
                             "invalid syntax") from None
    try:
        by_operation = parse_bool(query_param(params, "groupByOperation") or "false")
    except ValueError as exc:
        raise ValueError(f"unable to parse param 'groupByOperation': {exc}") from None
    end_ms = _ms(params, "endTs", time.time_ns() // 1_000_000)
    lookback, step, rate_per = (_ms(params, name, default) for name, default in (
        ("lookback", 3_600_000), ("step", 5_000), ("ratePer", 600_000)))
    found = store.span_series(metric, services, kinds, by_operation, end_ms * 1000, lookback * 1000, step * 1000,
                              rate_per * 1000, quantile)
    grouping = "service & operation" if by_operation else "service"
    help_text = f"{quantile:.2f}th quantile latency" if metric == "latencies" else _HELP[metric]
    return {"name": f"service_{'operation_' if by_operation else ''}{_NAMES[metric]}", "type": "GAUGE",
            "help": f"{help_text}, grouped by {grouping}",
            "metrics": [{"labels": [{"name": "service_name", "value": service},
                                    *([{"name": "operation", "value": op}] if by_operation else [])],
                         "metricPoints": [{"gaugeValue": {"doubleValue": value}, "timestamp": _timestamp(t)}
                                          for t, value in points]}
                        for (service, op), points in sorted(found.items())]}



def _ms(params, name: str, default: int) -> int:
    text = query_param(params, name)
    if text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"unable to parse param '{name}': strconv.ParseInt: parsing \"{text}\": invalid syntax") \
            from None


def _timestamp(us: int) -> str:
    """google.protobuf.Timestamp in JSON: RFC 3339 UTC, fraction only when not zero (3, 6 digits)."""
    seconds, micros = divmod(us, 1_000_000)
    text = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    if micros:
        text += f".{micros // 1000:03d}" if micros % 1000 == 0 else f".{micros:06d}"
    return text + "Z"
