"""The `otel` profile against the official OpenTelemetry Prometheus exporter.

The same Telemetry, read two ways: our `/metrics?compat=otel` rendering, and the official
`opentelemetry-exporter-prometheus` `PrometheusMetricReader` attached to it as users who already
run that reader would attach it (`Telemetry.attach_reader`). Every family the official reader
writes exists in ours under the same name and type, with the same labels (but the official
reader's `otel_scope_*` labels and the provider attribute, which the profile leaves to the
resource), the same counts, sums and counter totals."""

import prometheus_client
import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client.parser import text_string_to_metric_families

from tests.otel_llm.conftest import Harness
from tests.otel_llm.export.test_exposition import workload

PROCESS = ("process_", "python_", "target_info")  # prometheus_client's own collectors, the resource
ONLY_OFFICIAL_LABELS = {"otel_scope_name", "otel_scope_schema_url", "otel_scope_version", "gen_ai_provider_name"}


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text) if not f.name.startswith(PROCESS)}


def _totals(family) -> dict[str, float]:
    """Per sample name (`_count`, `_sum`, counters' `_total`), the sum over series: comparable across
    bucket layouts and label sets."""
    out: dict[str, float] = {}
    for s in family.samples:
        if not s.name.endswith("_bucket"):
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


@pytest.fixture
def both():
    h = Harness(metrics_compat="otel")
    workload(h)
    reader = PrometheusMetricReader()
    h.tel.attach_reader(reader)
    try:
        official = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    finally:
        reader.shutdown()
    return _families(official), _families(h.tel.render(profile="otel").decode())


def test_every_family_the_official_reader_writes_is_ours_by_name_type_and_labels(both):
    official, ours = both
    assert len(official) >= 20
    for name, fam in official.items():
        assert name in ours, name
        assert ours[name].type == fam.type, name
        official_labels = {k for s in fam.samples for k in s.labels} - ONLY_OFFICIAL_LABELS
        our_labels = {k for s in ours[name].samples for k in s.labels}
        if name == "gen_ai_server_request_duration_seconds":  # semconv's error.type instead of the reason
            official_labels = official_labels - {"otel_llm_finish_reason"} | ({"error_type"} & our_labels)
        assert our_labels == official_labels, name


def test_the_counts_sums_and_totals_agree(both):
    official, ours = both
    for name, fam in official.items():
        expected, got = _totals(fam), _totals(ours[name])
        assert got.keys() == expected.keys(), name
        for sample, value in expected.items():
            assert got[sample] == pytest.approx(value, rel=1e-9, abs=1e-12), (name, sample)
