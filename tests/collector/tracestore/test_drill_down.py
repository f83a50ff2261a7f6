"""Drilling into the fleet overview: a region's requests chosen meaningfully (all, or the failed, the
slowest and an even sample, never the first N), counted exactly; BubbleUp naming what sets a slow
region apart."""

from __future__ import annotations

import json
import random

import pytest

from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
from tests.collector.tracestore.test_request_heat import T0_US, get_data, request_span
from tests.collector.tracestore.test_store import request

WINDOW = (T0_US, T0_US + 600_000_000)


def workload(n: int = 2000, seed: int = 3) -> list[dict]:
    """Model `big` (a fifth of the requests, long prompts, on instance i-1) has ten times the TTFT."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        big = rng.random() < 0.2
        ttft = rng.lognormvariate(-3, 0.3) * (10 if big else 1)
        failed = rng.random() < 0.03
        out.append({"n": i + 1, "start_us": T0_US + rng.randrange(0, 600_000_000), "ttft": ttft, "e2e": ttft + 1.0,
                    "queue": 0.01, "tokens": 50, "error": "abort" if failed else None, "big": big,
                    "prompt": rng.randint(4000, 6000) if big else rng.randint(50, 400),
                    "lora": "sql" if rng.random() < 0.1 else None})
    return out


def fill(store: TraceStore, reqs: list[dict]) -> None:
    """The requests' spans (one request span each), `big` ones from instance i-1, the rest from i-0."""
    for big in (False, True):
        part = [r for r in reqs if r["big"] == big]
        for i in range(0, len(part), 500):
            spans = [request_span(r["n"], r["start_us"], r["ttft"], r["e2e"], r["queue"], r["tokens"], r["error"],
                                  **{"gen_ai.request.model": "big" if big else "small",
                                     "gen_ai.usage.input_tokens": r["prompt"],
                                     **({"otel_llm.lora.adapter": r["lora"]} if r["lora"] else {})})
                     for r in part[i:i + 500]]
            store.add(request(spans, service="vllm", **{"service.instance.id": f"i-{int(big)}"}).SerializeToString())


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    reqs = workload()
    store = TraceStore(TraceStoreConfig(str(tmp_path_factory.mktemp("store"))))
    fill(store, reqs)
    yield store, reqs
    store.close()


def numbers(traces) -> list[int]:
    return [int.from_bytes(t[0].span.trace_id[8:], "big") & 0xFFFF_FFFF for t in traces]


def test_a_region_that_fits_is_listed_whole_by_start(filled):
    store, reqs = filled
    matched, traces, chosen = store.choose_requests(*WINDOW, 1000, "ttft", 0.1, 0.2)
    want = sorted((r for r in reqs if 0.1 <= r["ttft"] < 0.2), key=lambda r: r["start_us"])
    assert (matched, chosen) == (len(want), "all") and numbers(traces) == [r["n"] for r in want]


def test_a_larger_region_lists_the_failed_the_slowest_and_a_sample_across_it(filled):
    store, reqs = filled
    inside = [r for r in reqs if r["ttft"] >= 0.05]
    matched, traces, chosen = store.choose_requests(*WINDOW, 40, "ttft", 0.05)
    got = numbers(traces)
    assert matched == len(inside) > 1000 and len(got) == len(set(got)) == 40
    assert chosen == "the failed (slowest ttft first), the slowest by ttft and an even sample"
    by_n = {r["n"]: r for r in reqs}
    failed = sorted((r for r in inside if r["error"]), key=lambda r: -r["ttft"])
    assert got[:10] == [r["n"] for r in failed[:10]]  # a quarter: the failed, slowest first
    slowest = [r["n"] for r in sorted(inside, key=lambda r: -r["ttft"]) if r["n"] not in got[:10]][:10]
    assert got[10:20] == slowest
    starts = sorted(by_n[n]["start_us"] for n in got[20:])  # the rest: spread over the ten minutes
    assert all(by_n[n]["ttft"] >= 0.05 for n in got) and len(starts) >= 15
    assert starts[0] - WINDOW[0] < 60_000_000 and WINDOW[1] - starts[-1] < 60_000_000
    assert max(b - a for a, b in zip(starts, starts[1:])) < 120_000_000


def test_bubbleup_names_the_model_instance_and_prompt_length_of_the_slow_requests(filled):
    store, reqs = filled
    dims = store.compare_requests(*WINDOW, "ttft", 0.2)
    by_name = {d["dimension"]: d for d in dims}
    slow = [r for r in reqs if r["ttft"] >= 0.2]
    top = by_name["model"]["values"][0]
    assert top["value"] == "big" and top["selected"] == sum(r["big"] for r in slow)
    assert top["rest"] == sum(r["big"] for r in reqs) - top["selected"]
    assert top["selected_share"] > 0.9 and top["rest_share"] < 0.1
    assert {d["dimension"] for d in dims[:3]} == {"model", "instance", "prompt_tokens"}  # all three tell it apart
    assert by_name["prompt_tokens"]["values"][0]["value"] == "2048-8191"
    assert by_name["service"]["difference"] == 0.0  # one service: nothing to tell
    lora = {v["value"]: v["selected"] + v["rest"] for v in by_name["lora"]["values"]}
    assert lora == {"sql": sum(r["lora"] == "sql" for r in reqs), "": sum(r["lora"] is None for r in reqs)}


def test_the_endpoints_answer_a_region(filled):
    store, reqs = filled
    query = f"start={WINDOW[0]}&end={WINDOW[1]}&metric=ttft&min=0.2"
    data = get_data(store, f"/api/llm/timeline?{query}&limit=50")
    assert data["matched"] == sum(r["ttft"] >= 0.2 for r in reqs) and len(data["rows"]) == 50
    assert all(r["ttft_s"] >= 0.2 for r in data["rows"]) and data["truncated"]
    assert get_data(store, f"/api/llm/bubbleup?{query}") == json.loads(json.dumps(
        store.compare_requests(*WINDOW, "ttft", 0.2)))
