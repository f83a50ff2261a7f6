"""prom_families: families declared through prometheus_client's API render byte for byte as prometheus_client."""

import re

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from otel_llm.export.prom_families import FamilySet, shim_classes


def declare_and_update(C, G, H, **kw):
    c = C(name="vllm:request_success", documentation="Count of\nrequests.", labelnames=["model_name", "engine", "reason"], **kw)
    for r in ("stop", "length"):
        c.labels("m", "0", r)
    c.labels("m", "0", "stop").inc(3)
    c.labels(model_name='q"x\\y', engine="1", reason="stop").inc(2.5)
    plain = C(name="vllm:plain_total", documentation="No labels.", **kw)
    plain.inc(1234567)
    h = H(name="vllm:latency_seconds", documentation="Latency.", labelnames=["model_name", "engine"],
          buckets=[0.001, 0.5, 1.0, 2.5, 1e7], **kw)
    for v in (0.0005, 0.3, 0.3, 2.0, 9e9):
        h.labels("m", "0").observe(v)
    h.labels("m", "1")
    g = G(name="vllm:kv_cache_usage_perc", documentation="Usage.", labelnames=["model_name", "engine"],
          multiprocess_mode="mostrecent", **kw)
    g.labels("m", "0").set(0.25)
    g.labels("m", "1").set(1e20)


def without_created_values(text: str) -> str:
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text)


def test_render_is_prometheus_clients_text_format():
    real = CollectorRegistry()
    declare_and_update(Counter, Gauge, Histogram, registry=real)
    fams = FamilySet(with_created=True)
    declare_and_update(*shim_classes(fams))
    ours = fams.render().decode()
    assert without_created_values(ours) == without_created_values(generate_latest(real).decode())
    assert 'vllm:plain_total 1.234567e+06' in ours and 'le="1e+07"' in ours


def test_collect_gives_prometheus_client_the_same_bytes():
    fams = FamilySet(with_created=True)
    declare_and_update(*shim_classes(fams))
    reg = CollectorRegistry()
    reg.register(fams)
    assert generate_latest(reg) == fams.render()


def test_a_source_supplies_values_and_prefixes_follow_new_children():
    fams = FamilySet(with_created=False)
    C, _, H = shim_classes(fams)
    c = C(name="vllm:tokens", documentation="Tokens.", labelnames=["engine"])
    c.labels("0")
    c.source = lambda child: 7.0 if child.labelvalues == ("0",) else 1.0
    h = H(name="vllm:h", documentation="H.", buckets=[1.0, 2.0])
    h.source = lambda child: ([1, 4, 5], 9.5)
    assert fams.render().decode() == (
        '# HELP vllm:tokens_total Tokens.\n# TYPE vllm:tokens_total counter\nvllm:tokens_total{engine="0"} 7.0\n'
        '# HELP vllm:h H.\n# TYPE vllm:h histogram\nvllm:h_bucket{le="1.0"} 1.0\nvllm:h_bucket{le="2.0"} 4.0\n'
        'vllm:h_bucket{le="+Inf"} 5.0\nvllm:h_count 5.0\nvllm:h_sum 9.5\n')
    c.labels("1")
    assert 'vllm:tokens_total{engine="1"} 1.0\n' in fams.render().decode()
