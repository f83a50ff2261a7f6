"""The fleet overview in `/ui`, in headless Chromium, over a trace store of 20,000 requests (a fifth of
them, of model `big` on instance i-1 with long prompts, ten times slower to a first token): the
heatmap counts every request as the store does; dragging over the slow band lists exactly that
region's requests (failed and slowest first, the count of all) and BubbleUp names the slow model,
instance and prompt length; clearing the selection goes back to the window."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest

from otel_llm.collector.extension.jaeger_query import JaegerQueryApi
from otel_llm.collector.tracestore.request_heat import NO_VALUE
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
from tests.collector.extension.test_web_ui import live_page, needs_chromium, page
from tests.collector.tracestore.test_drill_down import WINDOW, fill, workload
from tests.collector.tracestore.test_store import tid
from tests.server.api.api_server_harness import wait_until

REQUESTS = 20_000
DRAG = ("(type, target, x, y) => target.dispatchEvent(new MouseEvent(type, {bubbles: true, clientX: x, "
        "clientY: y}))")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    reqs = workload(REQUESTS)
    store = TraceStore(TraceStoreConfig(str(tmp_path_factory.mktemp("fleet"))))
    fill(store, reqs)
    api = JaegerQueryApi(store, "127.0.0.1", 0)
    api.start()
    yield api.url, store, reqs
    api.stop()
    store.close()


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())["data"]


@needs_chromium
def test_the_heatmap_counts_every_request_of_the_window(fleet, tmp_path):
    url, store, reqs = fleet
    dom = page(tmp_path, f"{url}/ui#start={WINDOW[0]}&end={WINDOW[1]}")
    cells = dom.kind("cell")
    assert sum(int(c["data-requests"]) for c in cells) == REQUESTS
    want = store.heatmap("ttft", *WINDOW)["cells"]
    assert sorted([int(c["data-column"]), int(c["data-bucket"]), int(c["data-requests"]), int(c["data-failed"])]
                  for c in cells) == sorted(c[:4] for c in want)
    assert sum(int(c["data-count"]) for c in dom.kind("overview-failed")) == sum(r["error"] is not None for r in reqs)
    assert dom.kind("overview-running") and dom.kind("overview-waiting")
    assert not dom.kind("bubbleup") and not dom.kind("region")  # nothing selected yet
    rows = dom.kind("row")
    assert len(rows) == 1000  # the timeline's limit, chosen: not the first 1000 by start
    starts = sorted(int(r["data-start-ns"]) // 1000 for r in rows)
    assert starts[-1] - starts[0] > 0.9 * (WINDOW[1] - WINDOW[0])


@pytest.mark.slow
@needs_chromium
def test_dragging_over_the_slow_band_lists_it_and_bubbleup_names_why(fleet, tmp_path):
    url, store, reqs = fleet
    with live_page(tmp_path, f"{url}/ui#start={WINDOW[0]}&end={WINDOW[1]}") as browser:
        assert browser.ready()
        assert wait_until(lambda: browser.eval("document.body.dataset.overviewMs") is not None)
        # from the top of the heatmap, a quarter of the way in, to the bottom of the bucket that holds 0.2 s,
        # three quarters of the way in
        slow = math.floor(math.log10(0.2) * 10)
        box = "(s) => document.querySelector(s).getBoundingClientRect()"
        heat = browser.eval(f"(({box})('#overview [data-kind=heatmap]')).toJSON()")
        cell = browser.eval(f"(({box})('#overview rect[data-kind=cell][data-bucket=\"{slow}\"]')).toJSON()")
        top_cell = max(int(c) for c in browser.eval(
            "[...document.querySelectorAll('#overview rect[data-kind=cell]')].map((c) => c.dataset.bucket)")
            if int(c) != NO_VALUE)
        x0, x1 = heat["left"] + heat["width"] * 0.25, heat["left"] + heat["width"] * 0.75
        y0, y1 = heat["top"] + 1, cell["bottom"] - 1
        browser.eval(f"({DRAG})('mousedown', document.getElementById('overview'), {x0}, {y0}); "
                     f"({DRAG})('mousemove', window, {x1}, {y1}); ({DRAG})('mouseup', window, {x1}, {y1})")
        assert wait_until(lambda: "rstart=" in browser.eval("location.hash")) and browser.ready()
        hash_ = dict(p.split("=") for p in browser.eval("location.hash.slice(1)").split("&"))
        low, high = float(hash_["rmin"]), float(hash_["rmax"])
        assert math.isclose(low, 10 ** (slow / 10), rel_tol=1e-5)
        assert math.isclose(high, 10 ** ((top_cell + 1) / 10), rel_tol=1e-5)
        start, end = int(hash_["rstart"]), int(hash_["rend"])
        inside = [r for r in reqs if start <= r["start_us"] <= end and low <= r["ttft"] < high]
        assert 100 < len(inside) < REQUESTS / 5
        assert wait_until(lambda: browser.eval("document.querySelectorAll('#timeline g[data-kind=row]').length")
                          == min(len(inside), 1000))
        shown = browser.eval("[...document.querySelectorAll('#timeline g[data-kind=row]')].map((g) => g.dataset.traceId)")
        assert set(shown) <= {tid(r["n"]).hex() for r in inside}  # every row listed lies in the region
        assert browser.eval("document.querySelector('#overview [data-kind=region]') !== null")
        # BubbleUp: the slow band is model big, instance i-1, long prompts
        assert wait_until(lambda: browser.eval("document.querySelectorAll('#bubbleup tr[data-kind=bubbleup]').length") > 0)
        table = browser.eval("[...document.querySelectorAll('#bubbleup tr[data-kind=bubbleup]')]"
                             ".map((r) => [r.dataset.dimension, r.dataset.value, +r.dataset.selected])")
        assert set(list(dict.fromkeys(d for d, _, _ in table))[:3]) == {"model", "instance", "prompt_tokens"}
        assert ["model", "big", sum(r["big"] for r in inside)] in table
        browser.eval("document.getElementById('clear-region').click()")
        assert wait_until(lambda: "rstart=" not in browser.eval("location.hash")) and browser.ready()
        assert wait_until(lambda: browser.eval("document.querySelectorAll('#timeline g[data-kind=row]').length") == 1000)
        assert browser.eval("document.querySelectorAll('#bubbleup tr').length") == 0
