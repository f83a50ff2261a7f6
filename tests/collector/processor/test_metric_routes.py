"""The collector's shim under every profile: a real Telemetry, driven by a hand-built engine, exports
over real OTLP/HTTP to a running collector, whose scrape must show what the server's own
`/metrics?compat=NAME` shows for the same data; speculative-decoding families pass through as they
arrive; LoRA adapters stay a label, bounded by the cardinality limit."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families as parse_text

from otel_llm import FinishReason, RequestInfo, SchedulerSnapshot
from otel_llm.collector.exporter.prometheus.metric_store import StoreConfig
from otel_llm.collector.processor.metric_routes import collector_profile
from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.shim.profiles import PROFILE_NAMES, aggregation_table
from tests.otel_llm.conftest import Harness

S, MS = 1_000_000_000, 1_000_000
CACHE = {"block_size": "16", "num_gpu_blocks": "128"}
OURS = ("job", "instance")  # the collector's labels, from the sender's resource


def drive(h: Harness, accepted_per_pos=((2, 1, 1), (1, 1, 1)), spec_decode: bool = True) -> None:
    """Ten requests, two of each finish reason, chat and completion, streamed and not, with latencies
    from a few ms to seconds; a preemption, cached prompt tokens, a LoRA adapter, speculative decoding
    (accepted tokens per draft position per step: `accepted_per_pos`), scheduler snapshots, and one
    request refused at admission."""
    h.tel.reject("max_num_queued_reqs")
    t = S
    for i, reason in enumerate(list(FinishReason) * 2):
        spread = 3 ** i  # latencies from ms to seconds: many buckets
        operation = ("chat", "text_completion")[i % 2]
        rid = h.tel.arrival(RequestInfo(f"r{i}", prompt_tokens=20 + 97 * i, operation=operation, max_tokens=8 + i,
                                        stream=i % 3 == 0, lora_name="sql" if i in (1, 4) else None))
        h.at(t).queued(rid)
        h.at(t + spread * 100_000).scheduled(rid, 16 * (i % 3), 4 * (i % 2))
        if i == 3:
            h.rec.preempted(rid)
            h.step(t + spread * 150_000, t + spread * 160_000)
            h.at(t + spread * 200_000).scheduled(rid)
        h.step(t + spread * 300_000, t + spread * 310_000, 20 + 97 * i)
        for k, per_pos in enumerate(accepted_per_pos):
            h.at(t + spread * MS * (k + 1)).outputs([rid], 1 + k)
            if spec_decode:
                h.rec.spec_decode(1, len(per_pos), sum(per_pos), list(per_pos))
            if k == len(accepted_per_pos) - 1:
                h.rec.finished(rid, reason)
            h.rec.snapshot(SchedulerSnapshot(running=1 + i % 3, waiting=i % 4, kv_usage=0.05 * i, prefix_queries=20,
                                             prefix_hits=8, waiting_deferred=i % 2))
            h.step(t + spread * MS * (k + 1), t + spread * MS * (k + 1) + 500)
        t += spread * 10 * MS


def new_collector(profile: str, **store) -> Collector:
    return Collector(CollectorConfig(otlp_http_port=0, otlp_grpc_port=None, prometheus_port=0,
                                     store=StoreConfig(profile=profile, **store)))


def push(collector: Collector, h: Harness, instance: str = "srv-1") -> None:
    """One collection of the Telemetry's metrics, through the OTel SDK's OTLP/HTTP exporter."""
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{collector.http.endpoint}/v1/metrics"),
                                           export_interval_millis=3_600_000)
    h.tel.attach_reader(reader, Resource.create({"service.name": "otel-llm", "service.instance.id": instance}))
    reader.collect()
    reader.shutdown()


def scrape(collector: Collector, openmetrics: bool = False) -> httpx.Response:
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    return httpx.get(collector.scrape.url, headers=accept, timeout=10)


def families(text: str, profile: str) -> dict[str, tuple[str, str, dict]]:
    """The profile's families with samples: name -> (type, help, {(sample, labels): value}), `le` as
    a number, the collector's own labels and families left out."""
    names = {f.name for f in collector_profile(profile).families}
    out = {}
    for fam in parse_text(text):
        if fam.name not in names or not fam.samples:
            continue
        series = {}
        for s in fam.samples:
            labels = {k: (float(v) if k == "le" else v) for k, v in s.labels.items() if k not in OURS}
            series[(s.name, frozenset(labels.items()))] = s.value
        out[fam.name] = (fam.type, fam.documentation, series)
    return out


def scaled(bounds, scale: float) -> list[float]:
    """Bounds in the family's unit, as decimals scale them (0.06 s -> 60 ms, not 60.00000000000001)."""
    return [float(Decimal(repr(b)) * Decimal(repr(scale))) for b in bounds]


def otlp_only_bounds(profile: str) -> dict[str, list[float]]:
    """Histogram families whose bounds are not a subset of the canonical bounds OTLP carries: the
    collector cannot re-bucket those exactly, so it shows OTLP's bounds (in the family's unit)."""
    table, out = aggregation_table(8192), {}
    for fam in collector_profile(profile).families:
        otlp = table[fam.canonical].otlp_buckets
        if fam.buckets is not None and not fam.part and not set(fam.canonical_buckets) <= set(otlp):
            out[fam.name] = scaled(otlp, fam.scale)
    return out


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_the_collector_shows_what_the_servers_own_metrics_shows(profile):
    """Families, types, HELP, label names and values, values and bucket bounds, series by series.
    Deliberate differences, each checked: (1) a series the server pre-creates (vLLM's and Triton's
    labelled children at 0) appears on the collector only once a series of its family arrived from
    that sender; (2) where the profile's bounds are not a subset of OTLP's canonical ones (most SGLang
    and TGI histograms, Triton's first-response histogram), the collector shows OTLP's bounds: every
    shared bound, `_sum` and `_count` agree."""
    h = Harness(metrics_compat=profile, cache_config=CACHE, num_speculative_tokens=3)
    drive(h)
    with new_collector(profile) as collector:
        push(collector, h)
        ours = families(scrape(collector).text, profile)
    servers = families(h.tel.render(profile=profile).decode(), profile)
    own_bounds = otlp_only_bounds(profile)
    precreated = set(servers) - set(ours)
    assert all(v == 0 for name in precreated for v in servers[name][2].values()), precreated
    assert len(ours) >= 10 and set(ours) <= set(servers)
    for name, (kind, help_text, series) in ours.items():
        server_kind, server_help, server_series = servers[name]
        assert (kind, help_text) == (server_kind, server_help), name
        if name in own_bounds:
            les = {dict(labels)["le"] for sample, labels in series if sample.endswith("_bucket")}
            assert les == {*own_bounds[name], float("inf")}, name
            shared = {k: v for k, v in series.items() if k in server_series}
            assert shared == pytest.approx({k: server_series[k] for k in shared}, rel=1e-12), name
            assert {k for k in server_series if not k[0].endswith("_bucket")} <= set(shared), name
            continue
        assert series == pytest.approx({k: v for k, v in server_series.items() if k in series}, rel=1e-12), name
        missing = {k: v for k, v in server_series.items() if k not in series}
        assert set(missing.values()) <= {0.0}, (name, missing)  # only pre-created children at 0


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_text_only_profiles_are_never_served_as_openmetrics(profile):
    h = Harness(cache_config=CACHE)
    drive(h)
    with new_collector(profile) as collector:
        push(collector, h)
        answer = scrape(collector, openmetrics=True)
    openmetrics = collector_profile(profile).openmetrics
    assert answer.headers["content-type"].startswith(
        "application/openmetrics-text" if openmetrics else "text/plain; version=0.0.4")
    assert answer.text.endswith("# EOF\n") is openmetrics
    if profile == "tgi":  # counters keep their names, as TGI's exporter writes them
        assert "# TYPE tgi_request_count counter\ntgi_request_count{" in answer.text


def test_triton_failures_are_precreated_from_the_successes_that_arrive():
    """Triton creates its failure series at model load: the collector pre-creates them as soon as the
    sender's finished-request series arrive, though none of them is a failure (`only`)."""
    h = Harness(metrics_compat="triton")
    rid = h.tel.arrival(RequestInfo("r", prompt_tokens=10))
    h.at(S).queued(rid)
    h.at(S + MS).scheduled(rid)
    h.at(S + 2 * MS).outputs([rid], 1)
    h.rec.finished(rid, FinishReason.STOP)
    h.step(S + 2 * MS, S + 3 * MS, 10)
    with new_collector("triton") as collector:
        push(collector, h)
        ours = families(scrape(collector).text, "triton")
    servers = families(h.tel.render().decode(), "triton")
    for name in ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count"):
        assert ours[name][2] == servers[name][2], name
    assert set(ours["nv_inference_request_failure"][2].values()) == {0.0}


def spec_decode_series(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if "position" in k))): s.value
            for fam in parse_text(text) if "spec_decode" in fam.name for s in fam.samples}


@pytest.mark.parametrize("profile", ["vllm", "otel"])
def test_spec_decode_families_pass_through_as_they_arrive(profile):
    """A server with 3 draft positions, none accepted at position 1: its four spec-decode families come
    out under the profile's names with the positions that arrived (the server's position 1 is a
    pre-created 0, which OTLP does not carry); a server without speculative decoding sends none."""
    h = Harness(num_speculative_tokens=3)
    drive(h, accepted_per_pos=((2, 0, 1), (1, 0, 1)))
    plain = Harness()
    drive(plain, spec_decode=False)
    with new_collector(profile) as collector:
        push(collector, h, "spec")
        push(collector, plain, "plain")
        text = scrape(collector).text
    ours = spec_decode_series(text)
    servers = spec_decode_series(h.tel.render(profile=profile).decode())
    position = "position" if profile == "vllm" else "otel_llm_spec_decode_position"
    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total" if profile == "vllm" else \
        "otel_llm_spec_decode_accepted_tokens_per_pos_total"
    assert {k: v for k, v in servers.items() if v} == ours  # 10 drafts, 20 draft tokens, ...
    assert {dict(labels).get(position) for name, labels in ours if name == per_pos} == {"0", "2"}
    assert len({name for name, _ in ours}) == 4
    assert 'instance="plain"' in text and not [line for line in text.splitlines()
                                                if "spec_decode" in line and 'instance="plain"' in line]


@pytest.mark.parametrize("server_limit, labelled, overflowed, refused", [(2000, 20, 20, 10), (10, 10, 40, 0)])
def test_lora_adapters_stay_a_label_up_to_the_cardinality_limit(server_limit, labelled, overflowed, refused):
    """50 adapters, one request each, to a collector whose limit is 20: the first 20 input series keep
    their adapter label, the next 20 go into the overflow series, the rest are refused (the store's
    rule for every metric). A server whose own limit is 10 sends 10 adapters and its overflow point,
    which joins the same overflow series."""
    h = Harness(metrics_compat="otel", cardinality_limit=server_limit)
    for i in range(50):
        h.tel.arrival(RequestInfo(f"r{i}", prompt_tokens=5, lora_name=f"adapter-{i}"))
    with new_collector("otel", cardinality_limit=20) as collector:
        push(collector, h)
        text = scrape(collector).text
    (fam,) = [f for f in parse_text(text) if f.name == "otel_llm_lora_requests"]
    adapters = {s.labels["otel_llm_lora_adapter"]: s.value for s in fam.samples if "otel_llm_lora_adapter" in s.labels}
    overflow = [s for s in fam.samples if s.labels.get("otel_metric_overflow") == "true"]
    assert adapters == {f"adapter-{i}": 1.0 for i in range(labelled)}
    assert [s.value for s in overflow] == [overflowed] and set(overflow[0].labels) == {"otel_metric_overflow", *OURS}
    assert all(s.labels["gen_ai_request_model"] == "m" for s in fam.samples if "otel_llm_lora_adapter" in s.labels)
    (refusals,) = [s.value for f in parse_text(text) if f.name == "otelcol_receiver_refused_metric_points"
                   for s in f.samples if s.labels["transport"] == "http"]
    # refused on each export (the reader's shutdown exports once more)
    assert refusals > 0 and refusals % refused == 0 if refused else refusals == 0
    server = {s.labels.get("otel_llm_lora_adapter"): s.value for f in parse_text(h.tel.render().decode())
              if f.name == "otel_llm_lora_requests" for s in f.samples}
    assert {a: server[a] for a in adapters} == adapters  # the server's label name and values
