"""The loads and comparisons the real-vLLM tests share: requests through the real `openai` client,
vLLM's `/metrics` parsed, an `otel-llm collector` process, totals compared exactly."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.ports import free_port
from tests.vllm.harness import REPO

MODEL = "tiny"
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
              "request_inference_time_seconds", "request_time_per_output_token_seconds", "request_prompt_tokens",
              "request_generation_tokens", "request_params_n", "request_params_max_tokens",
              "request_max_num_generation_tokens", "iteration_tokens_total", "request_num_preemptions")


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, labels without job/instance): value summed over senders}."""
    out: dict[tuple, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("vllm:"):
                key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("job", "instance"))))
                out[key] = out.get(key, 0.0) + s.value
    return out


def deterministic_load(url: str) -> tuple[list[str], list[float]]:
    """Sequential greedy requests: chat and completions, streamed and not, n=2, max_tokens=1."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    answers, latencies = [], []

    def timed(fn):
        t = time.perf_counter()
        answers.append(fn())
        latencies.append(time.perf_counter() - t)

    for i in range(4):
        timed(lambda: client.completions.create(model=MODEL, prompt=f"the cat {i} sat on", max_tokens=12,
                                                temperature=0).choices[0].text)
    timed(lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}],
                                                 max_tokens=10, temperature=0).choices[0].message.content)
    timed(lambda: "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="streamed words", max_tokens=9, temperature=0, stream=True) if c.choices))
    timed(lambda: "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream"}], max_tokens=7, temperature=0, stream=True)
        if c.choices))
    timed(lambda: "|".join(c.text for c in client.completions.create(
        model=MODEL, prompt="two of them", max_tokens=6, n=2, temperature=0.7, seed=7).choices))
    timed(lambda: client.completions.create(model=MODEL, prompt="one", max_tokens=1, temperature=0).choices[0].text)
    return answers, latencies


def hostile_load(url: str) -> None:
    """An aborted stream and a bad request."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    stream = client.completions.create(model=MODEL, prompt="abort me", max_tokens=400, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="bad", max_tokens=5000)


def wait_idle(url: str, timeout: float = 30.0) -> str:
    deadline = time.time() + timeout
    while True:
        text = httpx.get(url + "/metrics").text
        s = samples(text)
        running = sum(v for (n, _), v in s.items() if n in ("vllm:num_requests_running", "vllm:num_requests_waiting"))
        if running == 0 or time.time() > deadline:
            return text
        time.sleep(0.3)


def start_collector(*args: str, attempts: int = 3) -> SimpleNamespace:
    """`otel-llm collector` (as `python -m otel_llm collector`): the process and its ports, once it
    answers. A free port can be taken between `free_port` and the collector's bind (vLLM picks ports
    of its own): a collector that exits at start is started again on new ports."""
    for _ in range(attempts):
        ports = SimpleNamespace(http=free_port(), grpc=free_port(), prom=free_port(), jaeger=free_port())
        ports.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_llm", "collector", "--otlp-http-port", str(ports.http),
             "--otlp-grpc-port", str(ports.grpc), "--prometheus-port", str(ports.prom),
             "--jaeger-port", str(ports.jaeger), *args],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while ports.proc.poll() is None and time.time() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{ports.prom}/metrics", timeout=2)
                return ports
            except httpx.HTTPError:
                time.sleep(0.2)
        ports.proc.kill()
        ports.proc.wait(10)
    raise RuntimeError(f"otel-llm collector {' '.join(args)} did not start in {attempts} attempts")


_TOKENS = ("vllm:generation_tokens_total", (("engine", "0"), ("model_name", MODEL)))
_READ_BYTES = ("vllm:estimated_read_bytes_per_gpu_total", (("engine", "0"), ("model_name", MODEL)))


def idle_and_caught_up(url: str, prom_port: int, timeout: float = 20) -> tuple[str, dict]:
    """vLLM's `/metrics` once idle, and the collector's samples (summed over senders) once they agree
    with it: the generated-token totals equal and, where vLLM estimates them, the read bytes within 1 %.
    Both are read again until then: the pushes come every 500 ms, and an empty step after a reading
    bills the weights' reads to one side only. Past `timeout`, the last readings (the test's asserts
    then say what differs)."""
    deadline = time.time() + timeout
    while True:
        text = wait_idle(url)
        want = samples(text)
        got = samples(httpx.get(f"http://127.0.0.1:{prom_port}/metrics").text)
        read_bytes = want.get(_READ_BYTES)
        agree = got.get(_TOKENS) == want[_TOKENS] and (
            not read_bytes or math.isclose(got.get(_READ_BYTES, 0.0), read_bytes, rel_tol=0.01))
        if agree or time.time() > deadline:
            return text, got
        time.sleep(0.3)


def assert_totals_equal(want: dict, got: dict) -> None:
    """Request counts by reason, token and cache counters, every histogram's buckets, count and sum."""
    base = (("engine", "0"), ("model_name", MODEL))
    success = {k[1]: v for k, v in want.items() if k[0] == "vllm:request_success_total"}
    assert sum(success.values()) >= 10  # the load finished (the aborted stream is not counted by vLLM)
    for labels, v in success.items():
        assert got[("vllm:request_success_total", labels)] == v, labels
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert got[(name, base)] == want[(name, base)], name
    # vLLM's MFU estimates: declared by some releases without --enable-mfu-metrics (then 0, and not pushed);
    # with it, equal. An empty step bills only the weight reads, and one may land on either side of the
    # two readings, so the read bytes are equal within 1 %.
    for name, tolerance in (("vllm:estimated_flops_per_gpu_total", 0.0), ("vllm:estimated_write_bytes_per_gpu_total", 0.0),
                            ("vllm:estimated_read_bytes_per_gpu_total", 0.01)):
        if want.get((name, base)):
            assert math.isclose(got[(name, base)], want[(name, base)], rel_tol=tolerance), (
                name, got[(name, base)], want[(name, base)])
    served = [h for h in HISTOGRAMS if (f"vllm:{h}_count", base) in want]  # a release serves those it has
    assert len(served) >= len(HISTOGRAMS) - 1, served  # (request_num_preemptions: vLLM 0.30 on)
    for h in served:
        count, total = (f"vllm:{h}_count", base), (f"vllm:{h}_sum", base)
        assert got[count] == want[count], h
        assert math.isclose(got[total], want[total], rel_tol=1e-9, abs_tol=1e-12), h
        buckets = {k: v for k, v in want.items() if k[0] == f"vllm:{h}_bucket"}
        assert buckets and all(got[k] == v for k, v in buckets.items()), h


def assert_every_sample_served(want: dict, got: dict) -> None:
    """Every sample of vLLM's own `/metrics` (but prometheus_client's `_created`) is served by the
    collector fed by one API server's OTLP push, with the same labels and value (sums to float
    rounding): every family, pre-created zeros and the configuration's info point included."""
    assert len(want) > 300
    for key, v in want.items():
        if not key[0].endswith("_created"):
            assert key in got, key
            assert math.isclose(got[key], v, rel_tol=1e-9, abs_tol=1e-12), (key, got[key], v)


def families(text: str) -> dict[str, tuple]:
    """{vllm family: (type, label names, histogram buckets)}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("vllm:"):
            labels = {tuple(sorted(set(s.labels) - {"le"})) for s in fam.samples}
            les = tuple(s.labels["le"] for s in fam.samples if s.name.endswith("_bucket") and
                        s.labels.get("engine") == "0")
            out[fam.name] = (fam.type, labels, les)
    return out


def assert_same_families_and_counts(vllms: str, ours: str) -> dict[str, tuple]:
    """`replace` mode's exposition against vLLM's own for the same deterministic load: the same families
    (types, labels, buckets) and samples, equal apart from durations and step counts (two runs); returns
    the families."""
    theirs, mine = families(vllms), families(ours)
    assert mine == theirs
    want, got = samples(vllms), samples(ours)
    assert set(got) == set(want)
    for key, v in want.items():  # two runs: durations and the number of engine steps differ, the rest not
        if key[0].endswith("_created") or key[0].startswith("vllm:iteration_tokens_total") or (
                "_seconds_" in key[0] and not key[0].endswith("_count")):
            continue
        assert got[key] == v, key
    return mine
