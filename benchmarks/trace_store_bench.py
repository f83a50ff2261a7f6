"""The trace store at size: insert rate and query latencies with ``--spans`` stored spans.

Fills a store in a temporary directory with gen_ai request trees as otel_llm emits them (5 spans
each: HTTP SERVER span > ``chat {model}`` with gen_ai.latency.* attributes and a first_token
event > queue/prefill/decode) under a gateway's CLIENT span (service ``gateway``, exported after
the server's, as spans end), random trace ids, start times spread over the last 2 hours, three
servers, log-normal TTFT, ~2 % aborted and ~0.5 % errored; written in batches of 100 requests
(600 spans, about what the collector's writer merges). Then repeats each query and
reports median and p99 in ms:
- trace_lookup: `TraceStore.trace` of a random stored trace (target <= 10 ms);
  trace_lookup_json: the same plus the Jaeger JSON the HTTP endpoint renders;
- slowest_ttft_5m: the 20 slowest requests by TTFT in the last 5 minutes (target <= 100 ms);
- failed_5m: every failed request in the last 5 minutes;
- search_service_operation: Jaeger search, service + operation, limit 20 (last hour);
- search_tag: the same with a tag (error.type=abort), limit 20;
- search_tag_no_match_1h: a tag no span has (error.type=timeout): the whole hour is scanned;
- retention_noop: `enforce_retention` when nothing is due;
- http_*: the same through the collector's Jaeger query endpoint, as a UI asks it over HTTP (the
  answer's JSON included): a search by service + operation + one attribute + a duration range
  (1 s to 5 s), limit 20, in v1 (`/api/traces`, Grafana and older UIs) and v3
  (`/api/v3/trace-summaries`, Jaeger's current UI), and a trace by id in both (targets: search
  <= 200 ms, trace <= 20 ms, p99); the service dependencies (`/api/dependencies`) of the last hour
  (target <= 500 ms) and of the week Jaeger's UI asks for; the Monitor tab's heaviest request (p95
  latency per operation of one service over the last hour, a point a minute).
Also: insert rate (spans per second of `add`), database used bytes and file sizes, and the time
`enforce_retention` takes when the oldest 12 minutes (~10 % of the spans) expire at once.

Usage: python benchmarks/trace_store_bench.py [--spans 1000000] [--quick]   (prints one JSON object)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402
from opentelemetry.proto.trace.v1 import trace_pb2  # noqa: E402

from otel_llm.collector.extension.jaeger_query import JaegerQueryApi, trace_json  # noqa: E402
from otel_llm.collector.tracestore.query import TraceQuery  # noqa: E402
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig  # noqa: E402

SPANS_PER_REQUEST, REQUESTS_PER_BATCH = 6, 100
WINDOW_S = 2 * 3600
SERVICES = ("vllm-a", "vllm-b", "vllm-c")
GATEWAY = "gateway"
SERVER, INTERNAL = trace_pb2.Span.SPAN_KIND_SERVER, trace_pb2.Span.SPAN_KIND_INTERNAL


def _kv(key: str, v) -> KeyValue:
    if isinstance(v, float):
        return KeyValue(key=key, value=AnyValue(double_value=v))
    if isinstance(v, int):
        return KeyValue(key=key, value=AnyValue(int_value=v))
    if isinstance(v, list):
        return KeyValue(key=key, value=AnyValue(array_value={"values": [AnyValue(string_value=x) for x in v]}))
    return KeyValue(key=key, value=AnyValue(string_value=v))


def request_tree(rng: random.Random, start_ns: int) -> tuple[bytes, list[trace_pb2.Span], trace_pb2.Span]:
    """A server's 5 spans of one request, and the gateway's client span they answer."""
    trace_id = rng.getrandbits(128).to_bytes(16, "big")
    ids = [rng.getrandbits(64).to_bytes(8, "big") for _ in range(SPANS_PER_REQUEST)]
    queue_s = rng.expovariate(1 / 0.02)
    ttft_s = queue_s + rng.lognormvariate(-3.0, 0.6)
    out_tokens = rng.randint(16, 512)
    e2e_s = ttft_s + out_tokens * rng.uniform(0.008, 0.02)
    u = rng.random()
    reason = "abort" if u < 0.02 else "error" if u < 0.025 else "length" if u < 0.3 else "stop"
    first_ns, queued_ns, end_ns = (start_ns + int(s * 1e9) for s in (ttft_s, queue_s, e2e_s))
    attrs = [_kv(k, v) for k, v in (
        ("gen_ai.operation.name", "chat"), ("gen_ai.provider.name", "otel_llm"), ("gen_ai.request.model", "llama-3-8b"),
        ("gen_ai.response.model", "llama-3-8b"), ("gen_ai.request.id", f"cmpl-{trace_id.hex()[:16]}"),
        ("gen_ai.response.finish_reasons", [reason]), ("gen_ai.usage.input_tokens", rng.randint(20, 2000)),
        ("gen_ai.usage.output_tokens", out_tokens), ("gen_ai.request.max_tokens", 512),
        ("gen_ai.latency.e2e", e2e_s), ("gen_ai.latency.time_to_first_token", ttft_s),
        ("gen_ai.latency.time_in_queue", queue_s), ("gen_ai.latency.time_in_model_prefill", ttft_s - queue_s),
        ("gen_ai.latency.time_in_model_decode", e2e_s - ttft_s), ("gen_ai.latency.time_in_model_inference", e2e_s - queue_s))]
    status = None
    if reason in ("abort", "error"):
        attrs.append(_kv("error.type", reason))
        status = trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR, message=f"request finished with {reason}")
    op = [_kv("gen_ai.operation.name", "chat")]
    spans = [
        trace_pb2.Span(trace_id=trace_id, span_id=ids[0], parent_span_id=ids[5], name="POST /v1/chat/completions",
                       kind=SERVER,
                       start_time_unix_nano=start_ns - 200_000, end_time_unix_nano=end_ns + 300_000,
                       attributes=[_kv("http.request.method", "POST"), _kv("http.route", "/v1/chat/completions"),
                                   _kv("http.response.status_code", 200)]),
        trace_pb2.Span(trace_id=trace_id, span_id=ids[1], parent_span_id=ids[0], name="chat llama-3-8b", kind=INTERNAL,
                       start_time_unix_nano=start_ns, end_time_unix_nano=end_ns, attributes=attrs, status=status,
                       events=[trace_pb2.Span.Event(name="first_token", time_unix_nano=first_ns)]),
        trace_pb2.Span(trace_id=trace_id, span_id=ids[2], parent_span_id=ids[1], name="queue", kind=INTERNAL,
                       start_time_unix_nano=start_ns, end_time_unix_nano=queued_ns, attributes=op),
        trace_pb2.Span(trace_id=trace_id, span_id=ids[3], parent_span_id=ids[1], name="prefill", kind=INTERNAL,
                       start_time_unix_nano=queued_ns, end_time_unix_nano=first_ns, attributes=op),
        trace_pb2.Span(trace_id=trace_id, span_id=ids[4], parent_span_id=ids[1], name="decode", kind=INTERNAL,
                       start_time_unix_nano=first_ns, end_time_unix_nano=end_ns, attributes=op)]
    client = trace_pb2.Span(trace_id=trace_id, span_id=ids[5], name="POST upstream", kind=trace_pb2.Span.SPAN_KIND_CLIENT,
                            start_time_unix_nano=start_ns - 900_000, end_time_unix_nano=end_ns + 900_000)
    return trace_id, spans, client


def _export(service: str, spans: list[trace_pb2.Span]) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([_kv("service.name", service), _kv("service.instance.id", f"{service}-0"),
                                   _kv("telemetry.sdk.language", "python"), _kv("telemetry.sdk.version", "1.45.2")])
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = "otel_llm", "0.1.0"
    ss.spans.extend(spans)
    return req.SerializeToString()


def batch(rng: random.Random, service: str, starts_ns: list[int]) -> tuple[list[bytes], list[bytes]]:
    """The server's export of these requests, then the gateway's (children before their parents, as
    spans end), and the trace ids."""
    trees = [request_tree(rng, start_ns) for start_ns in starts_ns]
    return [_export(service, [s for _, spans, _ in trees for s in spans]),
            _export(GATEWAY, [client for _, _, client in trees])], [trace_id for trace_id, _, _ in trees]


def timed(fn, repeats: int) -> dict:
    fn()  # warm the caches once
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 3),
            "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 3), "repeats": repeats}


def run(num_spans: int, repeats: int) -> dict:
    rng = random.Random(42)
    num_requests = num_spans // SPANS_PER_REQUEST
    now_ns = time.time_ns()
    starts = sorted(now_ns - int(rng.uniform(0, WINDOW_S) * 1e9) for _ in range(num_requests))
    with tempfile.TemporaryDirectory() as directory:
        store = TraceStore(TraceStoreConfig(directory))
        add_s, stored, sample_ids = 0.0, 0, []
        t_all = time.perf_counter()
        for i in range(0, num_requests, REQUESTS_PER_BATCH):
            bodies, trace_ids = batch(rng, SERVICES[(i // REQUESTS_PER_BATCH) % len(SERVICES)],
                                      starts[i:i + REQUESTS_PER_BATCH])
            sample_ids.extend(trace_ids)
            t0 = time.perf_counter()
            for body in bodies:
                stored += store.add(body)
            add_s += time.perf_counter() - t0
        fill_s = time.perf_counter() - t_all
        now_us = time.time_ns() // 1000
        last_5m_us = now_us - 300_000_000
        search = TraceQuery("vllm-a", "chat llama-3-8b", now_us - 3600_000_000, now_us, limit=20)
        tagged = TraceQuery("vllm-a", "chat llama-3-8b", now_us - 3600_000_000, now_us, tags={"error.type": "abort"},
                            limit=20)
        no_match = TraceQuery("vllm-a", "chat llama-3-8b", now_us - 3600_000_000, now_us, tags={"error.type": "timeout"},
                              limit=20)
        lookup = lambda: store.trace(rng.choice(sample_ids).hex())  # noqa: E731
        queries = {
            "trace_lookup": timed(lookup, repeats * 4),
            "trace_lookup_json": timed(lambda: trace_json(lookup()), repeats * 4),
            "slowest_ttft_5m": timed(lambda: store.slowest_requests("ttft", last_5m_us, 20), repeats),
            "failed_5m": timed(lambda: store.failed_requests(last_5m_us, now_us, 1000), repeats),
            "search_service_operation": timed(lambda: store.find_traces(search), repeats),
            "search_tag": timed(lambda: store.find_traces(tagged), repeats),
            "search_tag_no_match_1h": timed(lambda: store.find_traces(no_match), max(3, repeats // 10)),
            "retention_noop": timed(lambda: store.enforce_retention(now_us), repeats),
            "dependencies_1h": timed(lambda: store.dependencies(now_us - 3600_000_000, now_us), repeats),
            **http_queries(store, rng.choice(sample_ids).hex(), now_us, repeats),
        }
        counts = {"requests_last_5m": sum(1 for s in starts if s >= last_5m_us * 1000),
                  "failed_last_5m": len(store.failed_requests(last_5m_us, now_us, 100_000)),
                  "search_traces": len(store.find_traces(search)), "search_tag_traces": len(store.find_traces(tagged))}
        path = store.path
        sizes = {"used_bytes": store.used_bytes(), "file_bytes": path.stat().st_size,
                 "wal_bytes": path.with_name(path.name + "-wal").stat().st_size}
        # the oldest 12 minutes (~10 %) fall out of a 24 h retention at once
        t0 = time.perf_counter()
        expired = store.enforce_retention(starts[0] // 1000 + 720_000_000 + 24 * 3600_000_000)
        retention = {"expired_spans": expired, "seconds": round(time.perf_counter() - t0, 3)}
        store.close()
    return {"spans": stored, "requests": num_requests, "batch_spans": REQUESTS_PER_BATCH * SPANS_PER_REQUEST,
            "insert": {"spans_per_s": round(stored / add_s), "add_s": round(add_s, 2),
                       "fill_s_incl_generation": round(fill_s, 2)},
            "queries": queries, "counts": counts, "sizes": sizes, "retention_expire_oldest_12min": retention,
            "bytes_per_span": round(sizes["used_bytes"] / max(1, stored), 1),
            "targets": {"trace_lookup_p99_ms<=10": queries["trace_lookup"]["p99_ms"] <= 10,
                        "slowest_ttft_5m_p99_ms<=100": queries["slowest_ttft_5m"]["p99_ms"] <= 100,
                        **{f"{name}_p99_ms<={limit}": queries[name]["p99_ms"] <= limit for name, limit in (
                            ("http_v1_search", 200), ("http_v3_search", 200), ("http_v1_trace", 20),
                            ("http_v3_trace", 20), ("http_dependencies_1h", 500))}}}


def http_queries(store: TraceStore, trace_id: str, now_us: int, repeats: int) -> dict:
    """The Jaeger endpoint's answers over HTTP, v1 and v3 (see the module docstring)."""
    api = JaegerQueryApi(store)
    api.start()

    def get(path: str, **params) -> int:
        with urllib.request.urlopen(f"{api.url}{path}?{urllib.parse.urlencode(params)}", timeout=30) as r:
            return len(r.read())

    def iso(us: int) -> str:
        return datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    start_us = now_us - 3600_000_000
    v1 = {"service": "vllm-a", "operation": "chat llama-3-8b", "tags": '{"error.type":"abort"}', "minDuration": "1s",
          "maxDuration": "5s", "start": start_us, "end": now_us, "limit": 20}
    v3 = {"query.serviceName": "vllm-a", "query.operationName": "chat llama-3-8b",
          "query.attributes": '{"error.type":"abort"}', "query.durationMin": "1s", "query.durationMax": "5s",
          "query.startTimeMin": iso(start_us), "query.startTimeMax": iso(now_us), "query.searchDepth": 20}
    try:
        return {"http_v1_search": timed(lambda: get("/api/traces", **v1), repeats),
                "http_v3_search": timed(lambda: get("/api/v3/trace-summaries", **v3), repeats),
                "http_v1_trace": timed(lambda: get(f"/api/traces/{trace_id}"), repeats * 4),
                "http_v3_trace": timed(lambda: get(f"/api/v3/traces/{trace_id}"), repeats * 4),
                "http_dependencies_1h": timed(lambda: get("/api/dependencies", endTs=now_us // 1000,
                                                          lookback=3600_000), repeats),
                "http_dependencies_week": timed(lambda: get("/api/dependencies", endTs=now_us // 1000,
                                                            lookback=7 * 86400_000), repeats),
                "http_monitor_latencies_1h": timed(lambda: get(
                    "/api/metrics/latencies", service="vllm-a", quantile=0.95, groupByOperation="true",
                    endTs=now_us // 1000, lookback=3600_000, step=60_000, ratePer=600_000), repeats)}
    finally:
        api.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=1_000_000, help="spans to store (default 1,000,000)")
    parser.add_argument("--quick", action="store_true", help="50,000 spans and fewer repeats")
    parser.add_argument("--repeats", type=int, default=50, help="runs of each query (trace lookups: 4x)")
    args = parser.parse_args()
    spans = 50_000 if args.quick else args.spans
    if spans < SPANS_PER_REQUEST * REQUESTS_PER_BATCH:
        parser.error(f"--spans must be at least {SPANS_PER_REQUEST * REQUESTS_PER_BATCH}, got {spans}")
    print(json.dumps(run(spans, 20 if args.quick else args.repeats), indent=1))


if __name__ == "__main__":
    main()
