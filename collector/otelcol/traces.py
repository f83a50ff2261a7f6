"""The traces part of the otelcol-contrib config: `otel-llm collector`'s trace flags as contrib components.

- `--traces-to URL`: one exporter each, named as our collector names it: `grpc://host:port` ->
  `otlp/N` (`endpoint: host:port`, plain text), `http(s)://...` -> `otlphttp/N` whose
  `traces_endpoint` is the full traces URL (used as is; `endpoint` would get /v1/traces appended).
  `--otelcol-traces-endpoint HOST:PORT` (older flag) -> `otlp/traces`, TLS if it starts with https://.
- `--storage-dir DIR`: the `file_storage` extension in DIR, and `sending_queue.storage` on every
  trace exporter (the queue is on by default, so `enabled` is not set).
- `--tail-sampling`: the `tail_sampling` processor, one policy per reason collector/tail_sampler.py
  keeps a trace for: `status_code` ERROR; OTTL `error.type` set; a `preempted` span event; each
  latency attribute above its threshold (OTTL, since `numeric_attribute` takes ints only); and
  `probabilistic` for keep_fraction. Policies are ORed: a trace any of them samples is kept.
  Like ours it decides soon after the root span arrives (`decision_wait_after_root_received`,
  contrib v0.144.0+), holds `num_traces` traces and remembers `decision_cache` decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from otel_llm.collector.exporter.otlp import DISK_QUEUE, OtlpExporterConfig
from otel_llm.collector.processor.tail_sampling import TailSamplingConfig

FILE_STORAGE = "file_storage"
TAIL_SAMPLING = "tail_sampling"
ROOT_GRACE = "1s"  # decision_wait_after_root_received: the processor decides on 1 s ticks
# (policy name, span attribute in seconds, the TailSamplingConfig threshold)
LATENCY_POLICIES = (("slow_ttft", "gen_ai.latency.time_to_first_token", "ttft_above_s"),
                    ("slow_e2e", "gen_ai.latency.e2e", "e2e_above_s"),
                    ("slow_queue", "gen_ai.latency.time_in_queue", "queue_above_s"))


class TracesPart(NamedTuple):
    extensions: dict  # id -> body
    processors: dict  # id -> body, in pipeline order (between memory_limiter and batch)
    exporters: dict  # id -> body


def _decimal(value: float) -> str:
    """A plain decimal that both Go durations and OTTL float literals accept (no exponent)."""
    text = f"{value:.9f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _duration(seconds: float) -> str:
    return _decimal(seconds).removesuffix(".0") + "s"


def _exporters(traces_to: Sequence[str], traces_endpoint: str | None) -> dict:
    exporters = {}
    for i, url in enumerate(traces_to):
        try:
            exporter = OtlpExporterConfig(url)
        except ValueError:
            raise ValueError(f"trace backend {url!r}: use http(s)://host:port[/path] or grpc://host:port") from None
        if exporter.grpc:
            exporters[f"otlp/{i}"] = {"endpoint": exporter.endpoint, "tls": {"insecure": True}}
        else:
            exporters[f"otlphttp/{i}"] = {"traces_endpoint": exporter.endpoint}
    if traces_endpoint:
        exporters["otlp/traces"] = {"endpoint": traces_endpoint,
                                    "tls": {"insecure": not traces_endpoint.startswith("https://")}}
    return exporters


def policies(sampling: TailSamplingConfig) -> list[dict]:
    """The tail_sampling policies that keep what `TailSampler` keeps (the kept fraction by another hash)."""
    out = [{"name": "error", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
           {"name": "error_type", "type": "ottl_condition",
            "ottl_condition": {"error_mode": "ignore", "span": ['attributes["error.type"] != nil']}},
           {"name": "preempted", "type": "ottl_condition",
            "ottl_condition": {"error_mode": "ignore", "spanevent": ['name == "preempted"']}}]
    for name, attribute, field in LATENCY_POLICIES:
        threshold = getattr(sampling, field)
        if threshold is not None:
            out.append({"name": name, "type": "ottl_condition", "ottl_condition": {
                "error_mode": "ignore", "span": [f'attributes["{attribute}"] > {_decimal(threshold)}']}})
    if sampling.keep_fraction > 0:
        out.append({"name": "sampled", "type": "probabilistic",
                    "probabilistic": {"sampling_percentage": round(sampling.keep_fraction * 100, 9)}})
    return out


def traces_part(traces_to: Sequence[str] = (), traces_endpoint: str | None = None, storage_dir: str | None = None,
                tail_sampling: TailSamplingConfig | None = None) -> TracesPart | None:
    """The components of the traces pipeline; None when there is no trace exporter.

    Raises ValueError naming a bad trace backend URL, or `storage_dir` / `tail_sampling` given
    without any trace exporter (they would configure nothing).
    """
    exporters = _exporters(traces_to, traces_endpoint)
    if not exporters:
        if storage_dir is not None:
            raise ValueError(f"storage_dir={storage_dir!r} holds trace exporters' queues: give traces_to "
                             "or traces_endpoint")
        if tail_sampling is not None:
            raise ValueError("tail_sampling samples the traces pipeline: give traces_to or traces_endpoint")
        return None
    extensions: dict = {}
    if storage_dir is not None:
        if not (isinstance(storage_dir, str) and storage_dir.strip()):
            raise ValueError(f"storage_dir={storage_dir!r}: must be a directory path")
        extensions[FILE_STORAGE] = {"directory": storage_dir}
        for body in exporters.values():
            body["sending_queue"] = {"storage": FILE_STORAGE}
    processors: dict = {}
    if tail_sampling is not None:
        processors[TAIL_SAMPLING] = {
            "decision_wait": _duration(tail_sampling.decision_wait_s),
            "decision_wait_after_root_received": ROOT_GRACE,
            "num_traces": tail_sampling.max_traces,
            "decision_cache": {"sampled_cache_size": tail_sampling.decided_cache,
                               "non_sampled_cache_size": tail_sampling.decided_cache},
            "policies": policies(tail_sampling)}
    return TracesPart(extensions, processors, exporters)


def header_lines(config: dict) -> list[str]:
    """What the traces pipeline of ``config`` (an `otelcol_config`) does differently from
    `otel-llm collector`, for the config's header."""
    if "traces" not in config["service"]["pipelines"]:
        return []
    lines = ["",
             "Traces: the same backends; what differs from `otel-llm collector`:",
             "- no trace store on this host (--trace-store, Jaeger's query API): query the backend.",
             "- no phase spans: vLLM's llm_request spans go on without derived queue/prefill/decode children",
             "  (no contrib processor creates spans); send them through `otel-llm collector` for those."]
    if FILE_STORAGE in config.get("extensions", {}):
        lines += ["- the persistent queue (file_storage; the directory must exist) holds sending_queue.queue_size",
                  f"  (1000) requests per backend; ours up to {DISK_QUEUE.queue_size:,} requests / "
                  f"{DISK_QUEUE.max_bytes // 1024**3} GiB each."]
    if TAIL_SAMPLING in config["processors"]:
        lines += [
            f"- tail_sampling decides {ROOT_GRACE} after a trace's root span arrives (its 1 s ticks), else",
            "  decision_wait after its first span; ours decides as the root arrives.",
            "- the kept fraction (probabilistic) hashes a salt and the trace id with FNV-1a; ours compares the",
            "  id's lower 64 bits with keep_fraction (as TraceIdRatioBased does): the same share, other traces.",
            "- a latency policy keeps a trace if any span's attribute is above the threshold; ours reads the",
            "  last value the trace carries (one request span carries each).",
            "- beyond num_traces the oldest traces are dropped undecided; ours decides them early with the",
            "  spans they have, and also bounds the spans waiting.",
        ]
    return lines
