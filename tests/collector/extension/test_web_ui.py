"""The request timeline web view (`/ui`) in a real browser. A real `otel-llm serve --model dummy`
under a load with preemptions (a KV cache of 32 blocks of 4 tokens) and aborts (streams the client
closes after the first token) sends its spans to a collector with a trace store; headless Chromium
loads `/ui` and its DOM must hold one row per request span in the store, every segment and mark at
its span's timestamps to the ns, filters that narrow the rows to exactly the matching requests,
the waterfall of the trace an exemplar on the server's `/metrics` names, opened by URL; and, driven
over the DevTools protocol, zoom, pan, reset, a click on a row and the filter and window controls."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
from openai import OpenAI

from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.collector.tracestore.query import TraceQuery
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
from tests.server.api.api_server_harness import ServerProcess, wait_until

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install "
                                                             "chromium; .ci/run installs it)")
PHASES = ("queue", "prefill", "decode")
CHATS, ABORTS = 10, 3


class Request(NamedTuple):
    """A request span as the store has it, read without `otel_llm.collector.timeline.rows`."""
    trace_id: str
    span_id: str
    start_ns: int
    end_ns: int
    phases: dict  # name -> (start_ns, end_ns)
    first_token_ns: int | None
    preemptions_ns: tuple[int, ...]
    finish_reason: str
    ttft_s: float | None


class Served(NamedTuple):
    api: str
    requests: dict[str, Request]  # by trace id: one request per trace here
    window: str  # the URL fragment of the load's window
    exemplar_trace_id: str
    store: TraceStore


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(tmp_path_factory.mktemp("traces"))))
    with Collector(config) as collector:
        server = ServerProcess("--otlp-traces-endpoint", f"{collector.http.endpoint}/v1/traces",
                               "--num-kv-blocks", "32", "--block-size", "4", "--max-model-len", "128",
                               env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
        server.start()
        try:
            start_us = time.time_ns() // 1000 - 1_000_000
            send_load(server.url)
            end_us = time.time_ns() // 1000 + 1_000_000
            openmetrics = httpx.get(f"{server.url}/metrics", timeout=10,
                                    headers={"Accept": "application/openmetrics-text; version=1.0.0"}).text
            store = collector.trace_store
            assert wait_until(lambda: len(stored_requests(store, start_us, end_us)) == CHATS + ABORTS, timeout_s=30)
        finally:
            server.stop()  # its last engine lane window leaves at shutdown
        assert wait_until(lambda: store.spans_named("engine steps", start_us, end_us, 10**8, 1000), timeout_s=10)
        requests = stored_requests(store, start_us, end_us)
        assert sum(len(r.preemptions_ns) for r in requests.values()) > 0, "the small KV cache should force preemptions"
        assert any(r.finish_reason == "abort" for r in requests.values()), "closed streams should be aborted"
        exemplars = re.findall(r'^vllm:e2e_request_latency_seconds_bucket\{.*\} \S+ # \{trace_id="([0-9a-f]{32})"',
                               openmetrics, re.M)
        yield Served(collector.jaeger.url, requests, f"start={start_us}&end={end_us}", exemplars[0], store)


def send_load(url: str) -> None:
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")

    def chat(i: int) -> None:
        client.chat.completions.create(model="dummy", max_tokens=50 + i,
                                       messages=[{"role": "user", "content": f"question number {i}"}])

    def abort(i: int) -> None:
        with httpx.stream("POST", f"{url}/v1/completions", timeout=30, json={
                "model": "dummy", "prompt": f"long {i}", "max_tokens": 120, "ignore_eos": True, "stream": True}) as r:
            next(r.iter_lines())  # the first token, then the client goes away: the server aborts it

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(CHATS)]
    threads += [threading.Thread(target=abort, args=(i,)) for i in range(ABORTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def stored_requests(store: TraceStore, start_us: int, end_us: int) -> dict[str, Request]:
    out = {}
    for spans in store.find_traces(TraceQuery("otel-llm", start_us=start_us, end_us=end_us, limit=1000)):
        for stored in spans:
            span = stored.span
            attrs = {kv.key: kv.value for kv in span.attributes}
            if not any(key.startswith("gen_ai.latency.") for key in attrs):
                continue
            phases = {s.span.name: (s.span.start_time_unix_nano, s.span.end_time_unix_nano) for s in spans
                      if s.span.parent_span_id == span.span_id}
            first = [e.time_unix_nano for e in span.events if e.name == "first_token"]
            finish = attrs["error.type"].string_value if "error.type" in attrs else \
                attrs["gen_ai.response.finish_reasons"].array_value.values[0].string_value
            ttft = attrs.get("gen_ai.latency.time_to_first_token")
            assert span.trace_id.hex() not in out
            out[span.trace_id.hex()] = Request(
                span.trace_id.hex(), span.span_id.hex(), span.start_time_unix_nano, span.end_time_unix_nano, phases,
                first[0] if first else None,
                tuple(sorted(e.time_unix_nano for e in span.events if e.name == "preempted")),
                finish, None if ttft is None else ttft.double_value)
    return out


class Dom(HTMLParser):
    """Every start tag of a dumped DOM as (tag, attributes)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.elements.append((tag, dict(attrs)))

    def kind(self, kind: str) -> list[dict[str, str]]:
        return [attrs for _, attrs in self.elements if attrs.get("data-kind") == kind]


def chromium(tmp_path: Path, url: str, *args: str) -> str:
    profile = tempfile.mkdtemp(dir=tmp_path, prefix="chromium-")
    done = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           f"--user-data-dir={profile}", "--window-size=1400,900", "--virtual-time-budget=10000",
                           *args, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def page(tmp_path: Path, url: str) -> Dom:
    text = chromium(tmp_path, url, "--dump-dom")
    dom = Dom(text)
    body = next(attrs for tag, attrs in dom.elements if tag == "body")
    assert body.get("data-state") == "ready", text[-3000:]
    return dom


def drawn_requests(dom: Dom) -> dict[str, Request]:
    """The timeline's rows as `Request`s, from the DOM's data attributes alone."""
    rows = {}
    for row in dom.kind("row"):
        trace_id = row["data-trace-id"]
        (request,) = [r for r in dom.kind("request") if r["data-trace-id"] == trace_id]
        assert (request["data-start-ns"], request["data-end-ns"]) == (row["data-start-ns"], row["data-end-ns"])
        phases = {kind: (int(r["data-start-ns"]), int(r["data-end-ns"])) for kind in PHASES
                  for r in dom.kind(kind) if r["data-trace-id"] == trace_id}
        first = [int(m["data-time-ns"]) for m in dom.kind("first_token") if m["data-trace-id"] == trace_id]
        assert len(first) <= 1 and trace_id not in rows
        rows[trace_id] = Request(trace_id, row["data-span-id"], int(row["data-start-ns"]), int(row["data-end-ns"]),
                                 phases, first[0] if first else None,
                                 tuple(sorted(int(m["data-time-ns"]) for m in dom.kind("preempted")
                                              if m["data-trace-id"] == trace_id)),
                                 row["data-finish-reason"], None)
    return rows


def without_ttft(requests: dict[str, Request]) -> dict[str, Request]:
    return {k: r._replace(ttft_s=None) for k, r in requests.items()}


@pytest.mark.slow
def test_the_timeline_endpoint_has_every_stored_request_to_the_ns(served):
    answer = httpx.get(f"{served.api}/api/llm/timeline?{served.window}", timeout=10).json()
    rows = {}
    for row in answer["data"]["rows"]:
        rows[row["trace_id"]] = Request(
            row["trace_id"], row["span_id"], int(row["start_ns"]), int(row["end_ns"]),
            {name: tuple(map(int, row[name])) for name in PHASES if row[name]},
            None if row["first_token_ns"] is None else int(row["first_token_ns"]),
            tuple(map(int, row["preemptions_ns"])), row["finish_reason"], row["ttft_s"])
    assert rows == served.requests


@pytest.mark.slow
@needs_chromium
def test_the_browser_draws_every_request_at_its_span_times(served, tmp_path):
    dom = page(tmp_path, f"{served.api}/ui#{served.window}")
    assert drawn_requests(dom) == without_ttft(served.requests)
    assert [int(p["data-points"]) for p in dom.kind("running") + dom.kind("waiting")] == [
        len(httpx.get(f"{served.api}/api/llm/timeline?{served.window}", timeout=10).json()["data"]["load"])] * 2
    assert len(page(tmp_path, f"{served.api}/ui").kind("row")) == len(served.requests)  # the last 15 minutes
    screenshot = tmp_path / "timeline.png"
    chromium(tmp_path, f"{served.api}/ui#{served.window}", f"--screenshot={screenshot}")
    assert screenshot.stat().st_size > 10_000
    print(f"timeline screenshot: {screenshot}")


@pytest.mark.slow
@needs_chromium
def test_filters_in_the_url_narrow_the_rows_exactly(served, tmp_path):
    aborted = {k: r for k, r in served.requests.items() if r.finish_reason == "abort"}
    dom = page(tmp_path, f"{served.api}/ui#{served.window}&finishReason=abort")
    assert drawn_requests(dom) == without_ttft(aborted)
    assert [s for s in (o.get("data-param") for _, o in dom.elements if _ == "select") if s] == [
        "model", "instance", "finishReason"]
    ttfts = sorted(r.ttft_s for r in served.requests.values() if r.ttft_s is not None)
    threshold = statistics.median(ttfts[len(ttfts) // 2 - 1:len(ttfts) // 2 + 1])  # between two distinct values
    slow = {k: r for k, r in served.requests.items() if r.ttft_s is not None and r.ttft_s > threshold}
    dom = page(tmp_path, f"{served.api}/ui#{served.window}&ttftAbove={threshold!r}")
    assert 0 < len(slow) < len(served.requests) and drawn_requests(dom) == without_ttft(slow)


@pytest.mark.slow
@needs_chromium
def test_an_exemplar_link_opens_its_trace_waterfall(served, tmp_path):
    trace_id = served.exemplar_trace_id
    (trace,) = httpx.get(f"{served.api}/api/traces/{trace_id}", timeout=10).json()["data"]
    dom = page(tmp_path, f"{served.api}/ui/trace/{trace_id}")  # redirects to /ui#trace=<id>
    bars = {b["data-span-id"]: b for b in dom.kind("span")}
    rows = {r["data-span-id"]: r for r in dom.kind("span-row")}
    ids = {s["spanID"] for s in trace["spans"]}
    assert set(bars) == set(rows) == ids and len(ids) >= 4  # HTTP server span, request span, queue/prefill/decode
    parents = {s["spanID"]: next((r["spanID"] for r in s["references"] if r["spanID"] in ids), "")
               for s in trace["spans"]}
    depth = lambda span_id: depth(parents[span_id]) + 1 if parents[span_id] else 0  # noqa: E731
    for span in trace["spans"]:
        parent = parents[span["spanID"]]
        assert rows[span["spanID"]]["data-parent-span-id"] == parent
        bar = bars[span["spanID"]]
        assert (bar["data-operation"], bar["data-start-us"], bar["data-end-us"]) == (
            span["operationName"], str(span["startTime"]), str(span["startTime"] + span["duration"]))
        events = sorted((e["data-name"], e["data-time-us"]) for e in dom.kind("event")
                        if e["data-span-id"] == span["spanID"])
        assert events == sorted((next(f["value"] for f in log["fields"] if f["key"] == "event"), str(log["timestamp"]))
                                for log in span["logs"])
        assert int(rows[span["spanID"]]["data-depth"]) == depth(span["spanID"])
    assert max(map(depth, ids)) == 2
    request = served.requests[trace_id]
    table = next(attrs for tag, attrs in dom.elements if tag == "table" and attrs.get("id") == "attributes")
    assert table["data-span-id"] == request.span_id  # the request span is selected first
    keys = {attrs["data-key"] for tag, attrs in dom.elements if tag == "tr" and "data-key" in attrs}
    assert {"gen_ai.latency.e2e", "gen_ai.request.model", "service.instance.id"} <= keys
    queue = next(s["spanID"] for s in trace["spans"] if s["operationName"] == "queue")
    dom = page(tmp_path, f"{served.api}/ui#trace={trace_id}&span={queue}")
    assert next(attrs for tag, attrs in dom.elements
                if tag == "table" and attrs.get("id") == "attributes")["data-span-id"] == queue
    screenshot = tmp_path / "waterfall.png"
    chromium(tmp_path, f"{served.api}/ui#{served.window}&trace={trace_id}", f"--screenshot={screenshot}")
    print(f"waterfall screenshot: {screenshot}")


class Page(NamedTuple):
    """A page of a headless Chromium, driven over the DevTools protocol (`Runtime.evaluate` only)."""
    ws: object  # a websockets.sync connection

    def eval(self, expression: str):
        self.ws.send(json.dumps({"id": 1, "method": "Runtime.evaluate", "params": {
            "expression": expression, "awaitPromise": True, "returnByValue": True}}))
        while (answer := json.loads(self.ws.recv(timeout=30))).get("id") != 1:
            pass  # an event
        assert "exceptionDetails" not in answer["result"], answer["result"]["exceptionDetails"]
        return answer["result"]["result"].get("value")

    def ready(self) -> bool:
        """Waits until the page has drawn what its URL says."""
        return wait_until(lambda: self.eval("document.body && document.body.dataset.state") == "ready", timeout_s=20)


@contextmanager
def live_page(tmp_path: Path, url: str):
    client = pytest.importorskip("websockets.sync.client")
    profile = Path(tempfile.mkdtemp(dir=tmp_path, prefix="chromium-"))
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             f"--user-data-dir={profile}", "--window-size=1400,900", "--remote-debugging-port=0", url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"  # Chromium writes its port there
        assert wait_until(lambda: port_file.exists() and len(port_file.read_text().split()) == 2, timeout_s=30)
        pages = httpx.get(f"http://127.0.0.1:{port_file.read_text().split()[0]}/json/list", timeout=10).json()
        with client.connect(next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page"), max_size=None) as ws:
            yield Page(ws)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


BAR = "document.querySelector('#timeline rect[data-kind=decode]')"
MOUSE = "(type, target, x) => target.dispatchEvent(new MouseEvent(type, {bubbles: true, clientX: x}))"


@pytest.mark.slow
@needs_chromium
def test_zoom_pan_click_and_controls_in_a_live_page(served, tmp_path):
    with live_page(tmp_path, f"{served.api}/ui#{served.window}") as browser:
        assert browser.ready()
        before = browser.eval(f"[{BAR}.x.baseVal.value, {BAR}.width.baseVal.value, {BAR}.dataset.startNs]")
        browser.eval("document.querySelector('#timeline').dispatchEvent(new WheelEvent('wheel', {deltaY: -400, "
                     "clientX: 700, clientY: 200, bubbles: true, cancelable: true}))")  # zoom in around x=700
        assert wait_until(lambda: browser.eval(f"{BAR}.width.baseVal.value") > before[1] * 1.5)
        zoomed = browser.eval(f"[{BAR}.x.baseVal.value, {BAR}.width.baseVal.value, {BAR}.dataset.startNs]")
        assert zoomed[2] == before[2]  # the times drawn are the same; only the pixels moved
        chart = "document.querySelector('#timeline')"
        browser.eval(f"({MOUSE})('mousedown', {chart}, 600); ({MOUSE})('mousemove', window, 700); "
                     f"({MOUSE})('mouseup', window, 700)")  # drag 100 px to the right
        assert wait_until(lambda: abs(browser.eval(f"{BAR}.x.baseVal.value") - (zoomed[0] + 100)) < 0.5)
        assert "trace=" not in browser.eval("location.hash")  # a drag is no click
        browser.eval("document.getElementById('reset-zoom').click()")
        assert wait_until(lambda: abs(browser.eval(f"{BAR}.x.baseVal.value") - before[0]) < 0.01)

        aborted = next(r for r in served.requests.values() if r.finish_reason == "abort")
        row = f"document.querySelector('#timeline rect[data-kind=request][data-trace-id=\"{aborted.trace_id}\"]')"
        browser.eval(f"({MOUSE})('mousedown', {row}, {row}.getBoundingClientRect().left + 3); "
                     f"({MOUSE})('mouseup', {row}, {row}.getBoundingClientRect().left + 3)")
        selected = "document.getElementById('attributes').dataset.spanId"
        assert wait_until(lambda: browser.eval(selected) == aborted.span_id)
        assert f"trace={aborted.trace_id}" in browser.eval("location.hash")
        assert browser.eval(f"{row}.parentNode.classList.contains('selected')")

        browser.eval("const f = document.querySelector('[data-param=finishReason]'); f.value = 'abort'; "
                     "f.dispatchEvent(new Event('change'))")
        count = "document.querySelectorAll('#timeline g[data-kind=row]').length"
        n_aborted = sum(r.finish_reason == "abort" for r in served.requests.values())
        assert wait_until(lambda: browser.eval(count) == n_aborted) and browser.ready()
        assert "finishReason=abort" in browser.eval("location.hash")
        browser.eval("document.querySelector('[data-lookback=\"60m\"]').click()")
        assert wait_until(lambda: "lookback=60m" in browser.eval("location.hash")) and browser.ready()
        assert "start=" not in browser.eval("location.hash") and browser.eval(count) == n_aborted
        browser.eval("document.getElementById('clear-filters').click()")
        assert wait_until(lambda: browser.eval(count) == len(served.requests))


def engine_summaries(api: str, window: str) -> dict[str, dict]:
    """Each request span's own summary of its steps (`otel_llm.engine.*`, computed by the server), by trace id."""
    out = {}
    for row in httpx.get(f"{api}/api/llm/timeline?{window}", timeout=10).json()["data"]["rows"]:
        (trace,) = httpx.get(f"{api}/api/traces/{row['trace_id']}", timeout=10).json()["data"]
        span = next(s for s in trace["spans"] if s["spanID"] == row["span_id"])
        tags = {t["key"]: t["value"] for t in span["tags"]}
        out[row["trace_id"]] = {k: tags[f"otel_llm.engine.{k}"] for k in ("steps", "interfering_prefill_tokens")
                                if f"otel_llm.engine.{k}" in tags}
    return out


@pytest.mark.slow
def test_the_engine_lane_the_collector_rebuilds_agrees_with_each_request_spans_summary(served):
    """The server summarised each request's steps from its own lane window; the collector rebuilt the
    lane from the exported `engine steps` spans: the steps each request ran in, and the prompt tokens
    computed during its decode, are the same both ways."""
    from otel_llm.collector.timeline.lanes import interference, lanes_from_spans, steps_of
    from otel_llm.collector.timeline.rows import rows_from_traces

    data = httpx.get(f"{served.api}/api/llm/timeline?{served.window}", timeout=10).json()["data"]
    (lane,) = data["lanes"]
    assert len(lane["end_us"]) > 20 and max(lane["num_requests"]) > 1 and sum(lane["preemptions"]) > 0
    assert all(a <= b for a, b in zip(lane["start_us"], lane["end_us"]))
    assert all(b <= c for b, c in zip(lane["end_us"], lane["start_us"][1:]))  # one engine: steps do not overlap
    summaries = engine_summaries(served.api, served.window)
    store = served.store
    start_us, end_us = (int(v.split("=")[1]) for v in served.window.split("&"))
    rows = rows_from_traces(store.request_traces(start_us, end_us))
    lanes = lanes_from_spans(store.spans_named("engine steps", start_us, end_us + 60_000_000, 10**8, 10_000))
    for row in rows:
        own = summaries[row.trace_id]
        found = steps_of(row, lanes)
        assert found is not None and len(found[1]) == own["steps"], (row.trace_id, own)
        assert sum(i.prefill_tokens for i in interference(row, lanes, rows)) == own["interfering_prefill_tokens"]


@pytest.mark.slow
@needs_chromium
def test_the_browser_draws_the_engine_lane_and_a_requests_steps_and_interference(served, tmp_path):
    data = httpx.get(f"{served.api}/api/llm/timeline?{served.window}", timeout=10).json()["data"]
    (lane,) = data["lanes"]
    summaries = engine_summaries(served.api, served.window)
    victim = max(summaries, key=lambda t: summaries[t].get("interfering_prefill_tokens", 0))
    assert summaries[victim]["interfering_prefill_tokens"] > 0, "the load should have prefills during decodes"
    dom = page(tmp_path, f"{served.api}/ui#{served.window}&trace={victim}")
    (drawn,) = dom.kind("lane")
    assert int(drawn["data-steps"]) == len(lane["end_us"]) and drawn["data-instance"] == lane["instance"]
    steps = dom.kind("step")
    assert sorted(int(s["data-index"]) for s in steps) == list(range(len(lane["end_us"])))  # all in view
    for s in steps:
        i = int(s["data-index"])
        assert (int(s["data-start-us"]), int(s["data-end-us"]), int(s["data-batch"]), int(s["data-prefill-tokens"])) == (
            lane["start_us"][i], lane["end_us"][i], lane["num_requests"][i], lane["prefill_tokens"][i])
    mine = [s for s in steps if "mine" in s["class"].split()]
    assert len(mine) == summaries[victim]["steps"]
    rows = dom.kind("interference")
    assert rows and sum(int(r["data-prefill-tokens"]) for r in rows) == summaries[victim]["interfering_prefill_tokens"]
    screenshot = tmp_path / "lane.png"
    chromium(tmp_path, f"{served.api}/ui#{served.window}&trace={victim}", f"--screenshot={screenshot}")
    print(f"engine lane screenshot: {screenshot}")
