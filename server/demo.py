"""`otel-llm demo`: drive a running server with the real `openai` client, then
read its `/metrics` the way a dashboard would.

It streams a few chat questions (bounded concurrency), prints some answers, and
summarises the server's own view of the run from the vLLM-compatible families:
TTFT / inter-token latency / end-to-end percentiles estimated from the histogram
buckets (as PromQL's `histogram_quantile`, over the demo's delta), generation
tokens/s, KV-cache usage, finished requests by reason, and where traces went.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

QUESTIONS = (
    "What is continuous batching?",
    "Explain time to first token in one sentence.",
    "Why does a KV cache help decoding?",
    "What does OpenTelemetry give an LLM server?",
    "Name three Prometheus metric types.",
    "What is a paged KV cache?",
    "How is inter-token latency measured?",
    "What does prefix caching save?",
)
_HISTOGRAMS = (
    ("TTFT", "vllm:time_to_first_token_seconds"),
    ("ITL", "vllm:inter_token_latency_seconds"),
    ("e2e", "vllm:e2e_request_latency_seconds"),
)


def scrape(url: str) -> dict:
    """`/metrics` as {sample name: {frozenset(labels): value}}."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    samples: dict = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name][frozenset(s.labels.items())] = s.value
    return samples


def _delta(after: dict, before: dict, name: str) -> dict:
    b = before.get(name, {})
    return {k: v - b.get(k, 0.0) for k, v in after.get(name, {}).items()}


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """PromQL's estimate: linear interpolation inside the bucket holding rank q*count.
    `buckets`: (upper bound, cumulative count), sorted, ending with +Inf."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def _buckets(delta: dict) -> list[tuple[float, float]]:
    merged: dict[float, float] = defaultdict(float)
    for labels, value in delta.items():
        le = dict(labels).get("le")
        if le is not None:
            merged[float(le)] += value
    return sorted(merged.items())


def _total(delta: dict) -> float:
    return sum(delta.values())


async def _drive(url: str, model: str, requests: int, concurrency: int, max_tokens: int,
                 api_key: str | None = None) -> list[tuple[str, str, float]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key or "not-needed", max_retries=0, timeout=300)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> tuple[str, str, float]:
        question = QUESTIONS[i % len(QUESTIONS)]
        async with gate:
            start = time.perf_counter()
            ttft = None
            pieces = []
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": question}], max_tokens=max_tokens,
                temperature=0.7, seed=i, stream=True,
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    pieces.append(chunk.choices[0].delta.content)
            return question, "".join(pieces), ttft or 0.0

    try:
        return await asyncio.gather(*(one(i) for i in range(requests)))
    finally:
        await client.close()


def run_demo(url: str, requests: int = 16, concurrency: int = 8, max_tokens: int = 48, model: str | None = None,
             timeline_url: str | None = None, api_key: str | None = None) -> int:
    """`timeline_url`: a collector's `/ui` that keeps the server's traces; the demo's requests are linked there.
    `api_key`: the server's --api-key, if it has one."""
    url = url.rstrip("/")
    try:
        health = httpx.get(f"{url}/health", timeout=10)
        answer = httpx.get(f"{url}/v1/models", timeout=10,
                           headers={} if api_key is None else {"Authorization": f"Bearer {api_key}"})
        if answer.status_code == 401:
            print(f"{url} asks for an API key: pass --api-key or set OTEL_LLM_API_KEY")
            return 1
        models = answer.json()
    except httpx.HTTPError as exc:
        print(f"cannot reach {url}: {exc}")
        return 1
    model = model or models["data"][0]["id"]
    print(f"server {url}: model {model}, health {health.status_code}")
    before = scrape(url)
    t0, started_us = time.perf_counter(), time.time_ns() // 1000
    results = asyncio.run(_drive(url, model, requests, concurrency, max_tokens, api_key))
    wall = time.perf_counter() - t0
    after = scrape(url)

    print(f"\n{len(results)} streamed chat requests, concurrency {concurrency}, {wall:.2f} s\n")
    for question, answer, ttft in results[:3]:
        print(f"Q: {question}\nA: {answer!r}\n   (client-side TTFT {ttft * 1000:.1f} ms)\n")

    if "vllm:generation_tokens_total" not in after:
        print("no vLLM-compatible families on /metrics (is the server running with --metrics-compat otel, "
              "or --disable-log-stats?)")
        return 0
    print("server-side, from /metrics (delta over this run; percentiles estimated from histogram buckets):")
    for label, name in _HISTOGRAMS:
        buckets = _buckets(_delta(after, before, f"{name}_bucket"))
        qs = [histogram_quantile(q, buckets) for q in (0.5, 0.9, 0.99)]
        if qs[0] is None:
            print(f"  {label:4s} no samples")
        else:
            print(f"  {label:4s} p50 {qs[0] * 1000:8.1f} ms   p90 {qs[1] * 1000:8.1f} ms   p99 {qs[2] * 1000:8.1f} ms")
    gen = _total(_delta(after, before, "vllm:generation_tokens_total"))
    prompt = _total(_delta(after, before, "vllm:prompt_tokens_total"))
    print(f"  tokens: {prompt:.0f} prompt, {gen:.0f} generated, {gen / wall:.1f} generated tokens/s")
    kv = after.get("vllm:kv_cache_usage_perc", {})
    print(f"  KV cache usage now: {100 * _total(kv):.1f}%")
    by_reason = {dict(k).get("finished_reason"): v for k, v in _delta(after, before, "vllm:request_success_total").items()}
    print("  finished requests: " + ", ".join(f"{r}={v:.0f}" for r, v in sorted(by_reason.items())))
    running = _total(after.get("vllm:num_requests_running", {}))
    waiting = _total(after.get("vllm:num_requests_waiting", {}))
    print(f"  running {running:.0f}, waiting {waiting:.0f}")
    traces = health.json().get("otlp_traces_endpoint") if health.status_code == 200 else None
    print(f"  traces: {'exported over OTLP to ' + traces if traces else 'tracing not exported'}")
    if timeline_url:  # a second either side: the window is the requests' arrival, by the wall clock
        window = f"start={started_us - 1_000_000}&end={time.time_ns() // 1000 + 1_000_000}"
        print(f"  request timeline of this run: {timeline_url}#{window}")
    return 0
