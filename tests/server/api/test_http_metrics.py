"""vLLM's `http_*` families (prometheus-fastapi-instrumentator) and prometheus_client's process,
platform and gc collectors on the real server's `/metrics`, after the SDK's families, in both formats."""

from __future__ import annotations

import json
import platform
from collections import Counter
from dataclasses import dataclass

import httpx
import pytest
from api_server_harness import ServerProcess, wait_until
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.harness import promtool_check_metrics

pytestmark = pytest.mark.slow

MAX_REQUEST_BYTES = 2048
OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}
HIGHR_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 7.5, 10, 30, 60,
                 float("inf")]
LOWR_BUCKETS = [0.1, 0.5, 1, float("inf")]
CMPL = "/v1/completions"


@dataclass(frozen=True)
class Sent:
    """One counted request: the route template vLLM's instrumentator should name, and what crossed the wire."""

    handler: str
    method: str
    status: int
    request_bytes: int  # Content-Length sent
    response_bytes: int  # Content-Length answered (0 for a stream)


@dataclass(frozen=True)
class Scraped:
    sent: tuple[Sent, ...]
    text: str
    openmetrics: str
    completions_while_streaming: float  # POST /v1/completions 2xx counted while a stream was still open
    completions_before_stream: float
    server_pid: int


def _send(client: httpx.Client, sent: list[Sent], handler: str, method: str, path: str, body: dict | None = None,
          stream: bool = False) -> httpx.Response:
    content = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"} if content is not None else {}
    if stream:
        with client.stream(method, path, content=content, headers=headers) as r:
            lines = [line for line in r.iter_lines() if line]
        assert r.status_code == 200 and lines[0].startswith("data: {") and lines[-1] == "data: [DONE]", lines
    else:
        r = client.request(method, path, content=content, headers=headers)
    sent.append(Sent(handler, method, r.status_code, len(content or b""), int(r.headers.get("content-length", 0))))
    return r


def _samples(text: str, name: str) -> dict[frozenset, float]:
    return {frozenset(s.labels.items()): s.value for f in parse_text(text) for s in f.samples if s.name == name}


def _completions_2xx(client: httpx.Client) -> float:
    labels = frozenset({("handler", CMPL), ("method", "POST"), ("status", "2xx")})
    return _samples(client.get("/metrics").text, "http_requests_total").get(labels, 0.0)


@pytest.fixture(scope="module")
def scraped():
    """A server of its own (exact counts), a known set of requests, then one scrape in each format."""
    server = ServerProcess("--max-request-bytes", str(MAX_REQUEST_BYTES)).start()
    sent: list[Sent] = []
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            for _ in range(2):
                assert _send(c, sent, CMPL, "POST", CMPL, {"model": "dummy", "prompt": "hi", "max_tokens": 3}
                             ).status_code == 200
            _send(c, sent, CMPL, "POST", CMPL, {"model": "dummy", "prompt": "sse", "max_tokens": 4, "stream": True,
                                                "ignore_eos": True}, stream=True)
            assert _send(c, sent, "/v1/chat/completions", "POST", "/v1/chat/completions",
                         {"model": "dummy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                         ).status_code == 200
            assert _send(c, sent, CMPL, "POST", CMPL, {"model": "dummy"}).status_code == 422
            assert _send(c, sent, CMPL, "POST", CMPL, {"model": "nope", "prompt": "x"}).status_code == 404
            assert _send(c, sent, CMPL, "POST", CMPL, {"model": "dummy", "prompt": "x" * 2 * MAX_REQUEST_BYTES}
                         ).status_code == 413  # BodyLimit's answer: counted too
            assert _send(c, sent, CMPL, "GET", CMPL).status_code == 405  # a partial match names the route
            assert _send(c, sent, "/v1/models", "GET", "/v1/models").status_code == 200
            assert _send(c, sent, "/v2/models/{name}/ready", "GET", "/v2/models/dummy/ready").status_code == 200
            assert _send(c, sent, "none", "GET", "/no/such/path").status_code == 404
            for path in ("/health", "/metrics", "/v2/health/live", "/v2/health/ready"):  # vLLM's exclusions
                assert c.get(path).status_code == 200, path

            # A long stream: its first chunk arrives while the request is not counted yet (it is counted
            # when its body ends), so the instrumentation passes the stream through instead of buffering it.
            before = _completions_2xx(c)
            body = json.dumps({"model": "dummy", "prompt": "long", "max_tokens": 2000, "stream": True,
                               "ignore_eos": True}).encode()
            with c.stream("POST", CMPL, content=body, headers={"content-type": "application/json"}) as r:
                lines = r.iter_lines()  # held: a dropped iterator closes the connection
                assert next(lines).startswith("data: {")
                during = _completions_2xx(c)
                assert next(line for line in lines if line).startswith("data: {")  # and the stream goes on
            sent.append(Sent(CMPL, "POST", r.status_code, len(body), 0))  # closed early: counted when aborted
            total = len(sent)
            wait_until(lambda: sum(_samples(c.get("/metrics").text, "http_requests_total").values()) >= total)
            text = c.get("/metrics").text
            om = c.get("/metrics", headers=OPENMETRICS)
            assert om.headers["content-type"].startswith("application/openmetrics-text")
        yield Scraped(tuple(sent), text, om.text, during, before, server.proc.pid)
    finally:
        server.stop()


def _expected_counts(sent) -> dict[frozenset, float]:
    counts = Counter((s.handler, s.method, f"{s.status // 100}xx") for s in sent)
    return {frozenset({("handler", h), ("method", m), ("status", st)}): float(n) for (h, m, st), n in counts.items()}


def test_requests_total_counts_every_request_by_route_method_and_status_class(scraped):
    expected = _expected_counts(scraped.sent)
    assert expected[frozenset({("handler", CMPL), ("method", "POST"), ("status", "2xx")})] == 4
    assert expected[frozenset({("handler", CMPL), ("method", "POST"), ("status", "4xx")})] == 3
    assert _samples(scraped.text, "http_requests_total") == expected


def test_excluded_handlers_are_not_counted(scraped):
    handlers = {dict(labels)["handler"] for labels in _samples(scraped.text, "http_requests_total")}
    assert handlers == {CMPL, "/v1/chat/completions", "/v1/models", "/v2/models/{name}/ready", "none"}
    assert not any("/health" in h or "/metrics" in h for h in handlers)


def test_a_stream_streams_through_the_instrumentation(scraped):
    assert scraped.completions_while_streaming == scraped.completions_before_stream == 3


def test_size_summaries_sum_the_content_lengths(scraped):
    handlers = {s.handler for s in scraped.sent}
    expected_count = {frozenset({("handler", h)}): float(sum(s.handler == h for s in scraped.sent)) for h in handlers}
    for name, field in (("http_request_size_bytes", "request_bytes"), ("http_response_size_bytes", "response_bytes")):
        expected_sum = {frozenset({("handler", h)}): float(sum(getattr(s, field) for s in scraped.sent
                                                               if s.handler == h)) for h in handlers}
        assert _samples(scraped.text, f"{name}_count") == expected_count, name
        assert _samples(scraped.text, f"{name}_sum") == expected_sum, name
    assert _samples(scraped.text, "http_request_size_bytes_sum")[frozenset({("handler", CMPL)})] > 2 * MAX_REQUEST_BYTES


def _buckets(text: str, name: str) -> dict[frozenset, list[float]]:
    """{labels without `le`: the `le` bounds in exposition order}"""
    out: dict[frozenset, list[float]] = {}
    for f in parse_text(text):
        for s in f.samples:
            if s.name == f"{name}_bucket":
                labels = frozenset((k, v) for k, v in s.labels.items() if k != "le")
                out.setdefault(labels, []).append(float(s.labels["le"]))
    return out


def test_duration_histograms_have_vllms_labels_and_buckets(scraped):
    assert _buckets(scraped.text, "http_request_duration_highr_seconds") == {frozenset(): HIGHR_BUCKETS}
    assert _samples(scraped.text, "http_request_duration_highr_seconds_count") == {frozenset(): len(scraped.sent)}
    per_route = Counter((s.handler, s.method) for s in scraped.sent)
    keys = {frozenset({("handler", h), ("method", m)}): float(n) for (h, m), n in per_route.items()}
    assert _buckets(scraped.text, "http_request_duration_seconds") == {k: LOWR_BUCKETS for k in keys}
    assert _samples(scraped.text, "http_request_duration_seconds_count") == keys


def test_process_and_python_collectors_describe_the_server_process(scraped):
    names = {f.name for f in parse_text(scraped.text)}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_virtual_memory_bytes",
            "process_open_fds", "process_max_fds", "process_start_time_seconds"} <= names
    assert {"python_gc_objects_collected", "python_gc_objects_uncollectable", "python_gc_collections"} <= names
    (info,) = _samples(scraped.text, "python_info")
    assert dict(info)["version"] == platform.python_version()  # the server runs this interpreter
    theirs = CollectorRegistry()
    ProcessCollector(pid=lambda: scraped.server_pid, registry=theirs)
    assert (_samples(scraped.text, "process_start_time_seconds")
            == _samples(generate_latest(theirs).decode(), "process_start_time_seconds"))


def test_both_formats_parse_with_each_family_once_and_one_eof(scraped):
    text_types = [line.split()[2] for line in scraped.text.splitlines() if line.startswith("# TYPE ")]
    om_types = [line.split()[2] for line in scraped.openmetrics.splitlines() if line.startswith("# TYPE ")]
    for types in (text_types, om_types):
        assert [n for n, k in Counter(types).items() if k > 1] == []
        assert "vllm:request_success" in {t.removesuffix("_total") for t in types}  # the SDK's families first
    assert "# EOF" not in scraped.text
    assert scraped.openmetrics.endswith("\n# EOF\n") and scraped.openmetrics.count("# EOF") == 1
    om = {f.name: f for f in parse_openmetrics(scraped.openmetrics)}
    assert {n: om[n].type for n in ("http_requests", "http_request_size_bytes", "http_response_size_bytes",
                                     "http_request_duration_highr_seconds", "http_request_duration_seconds",
                                     "process_cpu_seconds", "python_info")} == {
        "http_requests": "counter", "http_request_size_bytes": "summary", "http_response_size_bytes": "summary",
        "http_request_duration_highr_seconds": "histogram", "http_request_duration_seconds": "histogram",
        "process_cpu_seconds": "counter", "python_info": "gauge"}
    om_counts = {frozenset(s.labels.items()): s.value for s in om["http_requests"].samples
                 if s.name == "http_requests_total"}
    assert om_counts == _expected_counts(scraped.sent)


def test_promtool_finds_nothing_beyond_vllms_own_names(scraped):
    findings = promtool_check_metrics(scraped.text)
    assert [f for f in findings if not f.startswith("vllm:")] == []
