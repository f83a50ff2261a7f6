"""The Prometheus scrape receiver: a real vLLM 0.32 scrape (text and OpenMetrics) re-served unchanged under
the `vllm` profile and under canonical names under `otel`; bad targets (refused, hanging, 50 MB,
malformed, 100,000 series) bounded, reported in `up` and the self-metrics, never stalling a good one;
staleness; a restarted target's counters through a real Prometheus; the flags and the config file."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_llm.cli import build_parser
from otel_llm.collector.cli import config_from_args
from otel_llm.collector.exporter.prometheus import exposition
from otel_llm.collector.exporter.prometheus.metric_store import MetricStore, StoreConfig
from otel_llm.collector.receiver.scrape import Scraper, ScrapeTarget, load_scrape_config, parse_target
from otel_llm.collector.receiver.scrape_fetch import fetch
from otel_llm.collector.receiver.scrape_convert import Converter, ScrapeError
from otel_llm.collector.service import Collector, CollectorConfig
from tests.harness.ports import free_port
from tests.harness.scripted_http import serve_http, stop_http

DATA = Path(__file__).parents[1] / "data"
VLLM_TEXT = (DATA / "vllm_metrics.txt").read_text()  # a real vLLM 0.32 /metrics after a mixed load
VLLM_OPENMETRICS = (DATA / "vllm_metrics.openmetrics.txt").read_text()  # its /metrics/ (OpenMetrics)


def samples(text: str, drop=("job", "instance", "exported_job", "exported_instance")) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in drop)))] = s.value
    return out


def served(text: str, profile: str, openmetrics: bool = False, render_openmetrics: bool = False) -> str:
    store = MetricStore(StoreConfig(profile=profile))
    payload = Converter("vllm", "10.0.0.5:8000").convert(text, openmetrics, time.time_ns(), {"up": 1.0})
    result = store.ingest(payload)
    assert result.refused == 0, result
    return exposition.render(store, render_openmetrics, ()).decode()


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text 0.0.4", "OpenMetrics"])
def test_vllms_families_are_re_served_unchanged_under_the_vllm_profile(openmetrics):
    source = VLLM_TEXT
    if openmetrics:  # the same families as OpenMetrics (the collector's own OpenMetrics rendering)
        source = served(VLLM_TEXT, "vllm", render_openmetrics=True)
        assert source.endswith("# EOF\n")
    text = served(source, "vllm", openmetrics)
    want, got = samples(VLLM_TEXT), samples(text)
    vllm = {k: v for k, v in want.items() if k[0].startswith("vllm:")}
    assert len(vllm) > 250
    for key, value in want.items():
        if key[0].startswith(("vllm:", "http_request", "process_", "python_gc")):
            assert got[key] == value, key  # every value and label set, vLLM's buckets
    assert set(got) - set(want) == {("up", ()), ("scrape_samples_scraped", ()), ("target_info", ())}
    jobs = {(s.labels.get("job"), s.labels.get("instance")) for fam in text_string_to_metric_families(text)
            for s in fam.samples}
    assert jobs == {("vllm", "10.0.0.5:8000")}
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert types["vllm:e2e_request_latency_seconds"] == "histogram" and types["vllm:request_success"] == "counter"


def test_vllms_own_openmetrics_route_is_not_valid_openmetrics_and_says_so():
    """vLLM's /metrics/ (trailing slash) writes `vllm:` as `vllm_` and two names then clash: scrape /metrics."""
    with pytest.raises(ScrapeError, match="Clashing name") as err:
        Converter("vllm", "h:1").convert(VLLM_OPENMETRICS, True, 1, {})
    assert err.value.reason == "malformed"


def test_under_the_otel_profile_they_come_out_under_canonical_names_with_equal_values():
    want, got = samples(VLLM_TEXT), samples(served(VLLM_TEXT, "otel"))
    base = (("engine", "0"), ("model_name", "tiny-llama"))
    otel_base = (("gen_ai_request_model", "tiny-llama"), ("otel_llm_engine", "0"))
    for reason in ("stop", "length", "abort"):
        assert got[("otel_llm_request_finished_total", otel_base + (("otel_llm_finish_reason", reason),))] == \
            want[("vllm:request_success_total", (("engine", "0"), ("finished_reason", reason), ("model_name", "tiny-llama")))]
    assert got[("otel_llm_usage_generation_tokens_total", otel_base)] == want[("vllm:generation_tokens_total", base)]
    for vllm_name, otel_name in (("vllm:time_to_first_token_seconds", "gen_ai_server_time_to_first_token_seconds"),
                                 ("vllm:request_queue_time_seconds", "otel_llm_request_queue_duration_seconds"),
                                 ("vllm:inter_token_latency_seconds", "otel_llm_request_inter_token_latency_seconds")):
        for suffix in ("_count", "_sum"):
            assert got[(otel_name + suffix, otel_base)] == want[(vllm_name + suffix, base)], vllm_name
        theirs = {dict(k[1])["le"]: v for k, v in want.items() if k[0] == vllm_name + "_bucket"}
        mine = {dict(k[1])["le"]: v for k, v in got.items() if k[0] == otel_name + "_bucket"}
        assert len(mine) >= 10 and all(theirs[le] == v for le, v in mine.items())  # vLLM's bounds or an exact subset
    e2e = sum(v for k, v in got.items() if k[0] == "gen_ai_server_request_duration_seconds_count")
    assert e2e == want[("vllm:e2e_request_latency_seconds_count", base)]
    assert not [k for k in got if k[0].startswith("vllm:request_success")]  # a known family is converted
    assert got[("otel_llm_engine_sleep_state", otel_base + (("otel_llm_sleep_state", "awake"),))] == 1.0  # known
    assert ("vllm:estimated_flops_per_gpu_total", base) in got  # unknown to the profile (MFU off): its own name


def test_counters_restart_by_created_or_by_going_down():
    c = Converter("job", "h:1")
    store = MetricStore(StoreConfig(profile="otel"))

    def point(text, t):
        store.ingest(c.convert(text, False, t, {}))
        [p] = [s for s in store._metrics.values() if s.key[2] == "requests"][0].series.values()
        return p.start_ns, p.value
    def text(value, created=""):
        return f"# TYPE requests_total counter\nrequests_total {value}\n" + (
            f"# TYPE requests_created gauge\nrequests_created {created}\n" if created else "")
    assert point(text(5), 10**18) == (10**18, 5.0)
    assert point(text(9), 2 * 10**18) == (10**18, 9.0)
    assert point(text(2), 3 * 10**18) == (3 * 10**18, 2.0)  # went down: restarted
    assert point(text(3, "1.5e9"), 4 * 10**18) == (1_500_000_000 * 10**9, 3.0)  # text 0.0.4's `_created` gauge
    c.starts.clear()
    om = "# TYPE requests counter\nrequests_total 4\nrequests_created 1.6e9\n# EOF\n"
    store.ingest(c.convert(om, True, 5 * 10**18, {}))
    [p] = [s for s in store._metrics.values() if s.key[2] == "requests"][0].series.values()
    assert (p.start_ns, p.value) == (1_600_000_000 * 10**9, 4.0)  # OpenMetrics: in the family
    assert not [m for m in store._metrics.values() if "created" in m.key[2]]  # start times, not series


@pytest.mark.parametrize("text, reason", [
    ("this is { not prometheus", "malformed"),
    ("# TYPE h histogram\nh_bucket{le=\"1\"} 5\nh_bucket{le=\"+Inf\"} 3\nh_count 3\nh_sum 1\n", "malformed"),
    ("# TYPE h histogram\nh_bucket{le=\"1\"} 5\nh_count 5\nh_sum 1\n", "malformed"),
    ("".join(f"m{{i=\"{i}\"}} 1\n" for i in range(101)), "sample_limit"),
])
def test_bad_expositions_raise_with_a_reason(text, reason):
    with pytest.raises(ScrapeError) as err:
        Converter("j", "h:1", sample_limit=100).convert(text, False, 1, {})
    assert err.value.reason == reason


class Target:
    """A real HTTP /metrics endpoint whose answer a test sets (`body`, `delay_s`, or a size in `huge`)."""

    def __init__(self, body: str = "", huge: int = 0, hang: bool = False):
        self.body, self.huge, self.hang, self.hits = body, huge, hang, 0
        target = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                target.hits += 1
                if target.hang:
                    time.sleep(30)
                    return
                data = target.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(target.huge or len(data)))
                self.end_headers()
                try:
                    if target.huge:
                        chunk = b"# just a comment line to fill the body up to its size\n" * 1200
                        for _ in range(target.huge // len(chunk)):
                            self.wfile.write(chunk)
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.server = serve_http(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self):
        stop_http(self.server)


@pytest.fixture
def targets():
    made = []

    def make(**kwargs):
        made.append(Target(**kwargs))
        return made[-1]
    yield make
    for t in made:
        t.close()


def value(text: str, name: str, **labels) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


@pytest.mark.slow
def test_bad_targets_are_bounded_reported_and_never_stall_a_good_one(targets):
    good = targets(body=VLLM_TEXT)
    hanging = targets(hang=True)
    huge = targets(huge=50 * 1024 * 1024)
    malformed = targets(body="vllm:num_requests_running{engine= 1\n")
    many = targets(body="# TYPE wide gauge\n" + "".join(f'wide{{series="{i}"}} {i}\n' for i in range(100_000)))
    refused = f"http://127.0.0.1:{free_port()}/metrics"
    bad = {"timeout": hanging.url, "body_limit": huge.url, "malformed": malformed.url, "sample_limit": many.url,
           "unreachable": refused}
    scrape = [ScrapeTarget(good.url, "good", 0.5, 0.5)] + [ScrapeTarget(url, reason, 0.5, 0.5)
                                                            for reason, url in bad.items()]
    config = CollectorConfig(otlp_http_port=None, otlp_grpc_port=0, prometheus_port=0, scrape_targets=tuple(scrape))
    with Collector(config) as collector:
        time.sleep(3.0)
        text = collector.render().decode()
        scrapers = {s.target.job: s for s in collector.scrapers.scrapers}
        assert scrapers["good"].scrapes >= 3, scrapers["good"].scrapes  # every ~0.5 s, whatever the others do
        assert value(text, "up", job="good") == 1.0
        assert value(text, "vllm:generation_tokens_total", job="good") == \
            samples(VLLM_TEXT)[("vllm:generation_tokens_total", (("engine", "0"), ("model_name", "tiny-llama")))]
        for reason in bad:
            instance = scrapers[reason].target.instance
            assert value(text, "up", job=reason, instance=instance) == 0.0, reason
            assert value(text, "otel_llm_scrape_failures_total", job=reason, reason=reason) >= 1, (reason, text[-3000:])
            assert value(text, "scrape_duration_seconds", job=reason) <= 3, reason  # bounded (a hang is 30 s)
            assert value(text, "wide", job=reason) is None  # nothing of a failed scrape is kept
        assert value(text, "otelcol_receiver_refused_metric_points_total", receiver="prometheus") == 0
        assert value(text, "otelcol_receiver_accepted_metric_points_total", receiver="prometheus") > 0
    assert huge.hits >= 1 and many.hits >= 1


def test_series_a_target_stops_exposing_are_dropped_and_a_failed_scrape_keeps_only_up(targets):
    t = targets(body="# TYPE a gauge\na 1\n# TYPE b gauge\nb 2\n")
    store = MetricStore(StoreConfig())
    scraper = Scraper(ScrapeTarget(t.url, "t", 60, 5), store)  # driven by hand

    def render():
        return exposition.render(store, False, ()).decode()
    assert scraper.scrape_once()
    assert (value(render(), "a"), value(render(), "b"), value(render(), "up")) == (1.0, 2.0, 1.0)
    t.body = "# TYPE a gauge\na 3\n"
    assert scraper.scrape_once()
    assert (value(render(), "a"), value(render(), "b")) == (3.0, None)
    t.body = "garbage {{"
    assert not scraper.scrape_once()
    assert (value(render(), "a"), value(render(), "up"), value(render(), "scrape_samples_scraped")) == (None, 0.0, 0.0)
    assert scraper.failures == {"malformed": 1}


def test_a_body_of_the_last_ones_shape_skips_the_staleness_scan_and_nothing_stale_stays(targets):
    """Only values moved: every series is there again, so the store is not searched for vanished ones;
    a new shape, a failure and the way back are each followed by the series the target exposes, no other."""
    t = targets(body="# TYPE a gauge\na 1\n# TYPE b gauge\nb 2\n")
    store = MetricStore(StoreConfig())
    scraper = Scraper(ScrapeTarget(t.url, "t", 60, 5), store)
    scans = []
    drop = store.drop_unseen
    store.drop_unseen = lambda *args: scans.append(drop(*args)) or scans[-1]

    def shown():
        text = exposition.render(store, False, ())
        return {name: value(text.decode(), name) for name in ("a", "b", "up")}
    for body, scanned, want in (
            ("# TYPE a gauge\na 1\n# TYPE b gauge\nb 2\n", [0], {"a": 1.0, "b": 2.0, "up": 1.0}),  # a new plan
            ("# TYPE a gauge\na 5\n# TYPE b gauge\nb 6\n", [], {"a": 5.0, "b": 6.0, "up": 1.0}),  # values moved
            ("# TYPE a gauge\na 7\n", [1], {"a": 7.0, "b": None, "up": 1.0}),  # b went
            ("garbage {{", [1], {"a": None, "b": None, "up": 0.0}),  # failed: only up and the scrape_* stay
            ("# TYPE a gauge\na 8\n", [], {"a": 8.0, "b": None, "up": 1.0})):  # the last plan's shape again
        t.body = body
        scans.clear()
        scraper.scrape_once()
        assert (scans, shown()) == (scanned, want), body


def test_staleness_is_per_target_in_a_shared_store(targets):
    """What one target stops exposing goes, another target's same series stay; a series that comes
    back and goes again goes again."""
    a, b = targets(body="# TYPE g gauge\ng 1\n# TYPE h gauge\nh 1\n"), targets(body="# TYPE g gauge\ng 2\n")
    store = MetricStore(StoreConfig())
    one, two = Scraper(ScrapeTarget(a.url, "a", 60, 5), store), Scraper(ScrapeTarget(b.url, "b", 60, 5), store)

    def seen():
        text = exposition.render(store, False, ()).decode()
        return {job: (value(text, "g", job=job), value(text, "h", job=job)) for job in ("a", "b")}
    assert one.scrape_once() and two.scrape_once()
    assert seen() == {"a": (1.0, 1.0), "b": (2.0, None)}
    for body, want in (("# TYPE h gauge\nh 3\n", (None, 3.0)),
                       ("# TYPE g gauge\ng 4\n# TYPE h gauge\nh 5\n", (4.0, 5.0)),
                       ("# TYPE h gauge\nh 6\n", (None, 6.0))):
        a.body = body
        assert one.scrape_once()
        assert seen() == {"a": want, "b": (2.0, None)}
    a.body = "garbage {{"
    assert not one.scrape_once()
    assert seen() == {"a": (None, None), "b": (2.0, None)}
    assert two.scrape_once() and seen()["b"] == (2.0, None)


@pytest.mark.slow
def test_a_restarted_target_resets_its_counters_in_promql_increase(targets, prometheus_server):
    t = targets(body="# TYPE vllm:request_success counter\n"
                     'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 100\n'
                     'vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9\n')
    config = CollectorConfig(otlp_http_port=None, otlp_grpc_port=0, prometheus_port=0,
                             scrape_targets=(ScrapeTarget(t.url, "vllm", 0.5, 0.5),))
    with Collector(config) as collector:
        prometheus = prometheus_server(f"127.0.0.1:{collector.scrape.port}", honor_labels=True)
        prometheus.wait_for_scrapes(3)
        series = 'vllm:request_success_total{job="vllm",finished_reason="stop"}'
        t.body = t.body.replace(" 100\n", " 130\n")  # 30 more
        time.sleep(2.5)
        t.body = t.body.replace(" 130\n", " 20\n").replace("1.7e9", "1.8e9")  # restarted, then 20 more
        time.sleep(2.5)
        assert prometheus.value(f"resets({series}[1m])") == 1.0
        increase = prometheus.value(f"increase({series}[1m])")
        assert 50 <= increase <= 50 * 1.5, increase  # 30 + 20 (Prometheus extrapolates to the window's edges)
        assert prometheus.value(f"max_over_time({series}[1m])") == 130


def test_flags_and_the_config_file(tmp_path):
    args = build_parser().parse_args(["collector", "--scrape-target", "vllm=http://10.0.0.5:8000/metrics",
                                      "--scrape-target", "10.0.0.6:30000", "--scrape-interval", "5s"])
    a, b = config_from_args(args).scrape_targets
    assert (a.job, a.instance, a.url, a.interval_s, a.timeout_s) == ("vllm", "10.0.0.5:8000",
                                                                      "http://10.0.0.5:8000/metrics", 5.0, 5.0)
    assert (b.job, b.instance, b.url) == ("scrape", "10.0.0.6:30000", "http://10.0.0.6:30000/metrics")
    assert parse_target("https://h/m?x=1").instance == "h:443"
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 30s}\nscrape_configs:\n"
                      "  - job_name: sglang\n    metrics_path: /m\n    scrape_timeout: 1m30s\n"
                      "    sample_limit: 1000\n    body_size_limit: 2MB\n"
                      "    static_configs: [{targets: ['a:1', 'b:2'], labels: {zone: z1}}]\n")
    x, y = load_scrape_config(str(config))
    assert (x.url, x.job, x.interval_s, x.timeout_s, x.sample_limit, x.body_limit, x.labels) == (
        "http://a:1/m", "sglang", 30.0, 30.0, 1000, 2 << 20, (("zone", "z1"),))
    assert y.instance == "b:2"
    for bad, message in (("scrape_configs:\n  - job_name: j\n    relabel_configs: []\n", "relabel_configs not supported"),
                         ("scrape_configs:\n  - {job_name: j, scrape_interval: soon}\n", "not a duration"),
                         ("nothing: here\n", "no scrape_configs"),
                         ("scrape_configs:\n  - static_configs: []\n", "needs a job_name")):
        config.write_text(bad)
        with pytest.raises(ValueError, match=message):
            load_scrape_config(str(config))
    for flags, message in ((["--scrape-target", "ftp://x/metrics"], "http"),
                           (["--scrape-target", "h:1", "--scrape-target", "h:1"], "different jobs"),
                           (["--scrape-target", "h:1", "--scrape-timeout", "20s"], "longer than")):
        with pytest.raises(ValueError, match=message):
            config_from_args(build_parser().parse_args(["collector", *flags]))


def test_the_cli_says_what_is_wrong_and_exits_2(capsys):
    from otel_llm.collector.cli import run
    args = build_parser().parse_args(["collector", "--scrape-target", "ftp://x/metrics"])
    assert run(args) == 2
    assert "--scrape-target 'ftp://x/metrics'" in capsys.readouterr().err
    args = build_parser().parse_args(["collector", "--print-otelcol-config", "--scrape-target", "h:1"])
    assert run(args) == 2
    assert "prometheus receiver" in capsys.readouterr().err


def trickling_target(chunks) -> tuple[str, socket.socket]:
    """(url, listening socket) of a target that answers one scrape with `chunks`, 0.1 s apart."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def trickle():
        conn, _ = server.accept()
        conn.recv(4096)
        try:
            for chunk in chunks:
                conn.sendall(chunk)
                time.sleep(0.1)
        except OSError:
            pass
        conn.close()
    threading.Thread(target=trickle, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/metrics", server


def test_a_slow_dribbling_target_is_cut_at_the_timeout():
    url, server = trickling_target([b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"] + [b"# x\n" * 200] * 40)
    t0 = time.monotonic()
    with pytest.raises(ScrapeError, match="within"):
        fetch(ScrapeTarget(url, "j", 1.0, 0.5))
    assert time.monotonic() - t0 < 1.5
    server.close()


def test_a_target_trickling_its_headers_is_cut_at_the_scrape_timeout():
    """A byte every 0.1 s resets a per-read timeout: only one deadline for the whole scrape ends it
    (before: a 43 s scrape under a 4 s timeout, counted as up)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Slow: " + b"a" * 100
    url, server = trickling_target([bytes([byte]) for byte in head])
    config = CollectorConfig(otlp_http_port=None, otlp_grpc_port=0, prometheus_port=None,
                             scrape_targets=(ScrapeTarget(url, "slow", 60.0, 1.0),))
    with Collector(config) as collector:
        scraper = collector.scrapers.scrapers[0]
        deadline = time.monotonic() + 8
        while not scraper.scrapes and time.monotonic() < deadline:
            time.sleep(0.05)
        text = collector.render().decode()
    server.close()
    assert scraper.failures == {"timeout": 1}
    assert value(text, "up", job="slow") == 0.0
    assert value(text, "scrape_duration_seconds", job="slow") < 2


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_scraped_metrics_go_out_over_otlp_under_canonical_names(targets, transport):
    """--metrics-to: a second collector receives what the first one scraped, as canonical OTLP metrics,
    and serves them under its own profile with vLLM's values."""
    t = targets(body=VLLM_TEXT)
    downstream = CollectorConfig(otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0,
                                 store=StoreConfig(profile="otel"))
    with Collector(downstream) as b:
        url = f"{b.http.endpoint}/v1/metrics" if transport == "http" else f"grpc://{b.grpc.endpoint}"
        config = CollectorConfig(otlp_http_port=None, otlp_grpc_port=0, prometheus_port=0, metrics_to=(url,),
                                 scrape_targets=(ScrapeTarget(t.url, "vllm", 0.5, 0.5),))
        exporter = "otlphttp/metrics/0" if transport == "http" else "otlp/metrics/0"
        with Collector(config) as a:
            deadline = time.time() + 10
            while time.time() < deadline and not (  # (b has the points a moment before a's send is counted)
                    value(b.render().decode(), "up", job="vllm") == 1.0
                    and (value(a.render().decode(), "otelcol_exporter_sent_metric_points_total", exporter=exporter)
                         or 0) > 0):
                time.sleep(0.2)
            mine = a.render().decode()
        text = b.render().decode()
    base = (("engine", "0"), ("model_name", "tiny-llama"))
    want = samples(VLLM_TEXT)
    assert value(text, "otel_llm_usage_generation_tokens_total", job="vllm", instance=t.url.split("/")[2]) == \
        want[("vllm:generation_tokens_total", base)]
    assert value(text, "gen_ai_server_time_to_first_token_seconds_count", job="vllm") == \
        want[("vllm:time_to_first_token_seconds_count", base)]
    assert value(text, "otel_llm_engine_sleep_state", job="vllm", otel_llm_sleep_state="awake") == 1.0
    assert value(text, "vllm:estimated_flops_per_gpu_total", job="vllm") == 0.0  # unknown: passed through
    assert value(mine, "otelcol_exporter_sent_metric_points_total", exporter=exporter) > 0
    assert value(mine, "otelcol_exporter_send_failed_metric_points_total", exporter=exporter) == 0


@pytest.mark.slow
def test_scraped_series_are_remote_written_to_a_real_prometheus(targets, prometheus_server):
    t = targets(body=VLLM_TEXT)
    server = prometheus_server(None, extra_flags=("--web.enable-remote-write-receiver",))
    config = CollectorConfig(otlp_http_port=None, otlp_grpc_port=0, prometheus_port=0,
                             remote_write_urls=(server.url + "/api/v1/write",),
                             scrape_targets=(ScrapeTarget(t.url, "vllm", 0.5, 0.5),))
    want = samples(VLLM_TEXT)
    base = (("engine", "0"), ("model_name", "tiny-llama"))
    with Collector(config):
        deadline = time.time() + 15
        while not server.query('vllm:generation_tokens_total{job="vllm"}') and time.time() < deadline:
            time.sleep(0.3)
    instance = t.url.split("/")[2]
    assert server.value(f'vllm:generation_tokens_total{{job="vllm",instance="{instance}"}}') == \
        want[("vllm:generation_tokens_total", base)]
    assert server.value('sum(vllm:e2e_request_latency_seconds_count{job="vllm"})') == \
        want[("vllm:e2e_request_latency_seconds_count", base)]
    assert server.value(f'up{{job="vllm",instance="{instance}"}}') == 1.0
