"""An export's layout: its points and moving fields read exactly as the wire view reads them, another
payload recognised only when every other byte is the same, and anything not plain left to the full path."""

import struct

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_llm.collector.pdata import metrics_wire as wire
from otel_llm.collector.pdata.metrics_layout import HistogramPoint, Layout, first_resource
from tests.collector.exporter.prometheus.test_metric_store import otlp_of, serve_some
from tests.collector.otlp_builders import SEC, counter, gauge, histogram, request
from tests.otel_llm.conftest import Harness


def server_exports(n: int = 3) -> list[bytes]:
    """A real server's successive exports (values, timestamps and exemplars move between them)."""
    h, out = Harness(), []
    for _ in range(n):
        serve_some(h, 4)
        out.append(otlp_of(h, "srv-1"))
    return out


def view_points(payload: bytes):
    """(metric, point) of every point, as the store's wire view reads them."""
    req = wire.ExportMetricsServiceRequest.FromString(payload)
    return [(rm, sm, m, p) for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            for p in getattr(m, m.WhichOneof("data")).data_points]


def assert_reads_as_the_view(layout: Layout, payload: bytes) -> None:
    values = layout.values(payload)
    assert values is not None
    exemplar_values = layout.exemplar_values(payload)
    points = [(m, p) for m in layout.metrics for p in m.points]
    viewed = view_points(payload)
    assert len(points) == len(viewed) == layout.num_points
    for (m, p), (rm, sm, vm, vp) in zip(points, viewed):
        assert (m.resource, m.scope, m.name, m.kind) == (rm.resource, sm.scope, vm.name, vm.WhichOneof("data"))
        data = getattr(vm, m.kind)
        if m.kind != "gauge":
            assert m.temporality == data.aggregation_temporality
        assert m.monotonic == (m.kind == "sum" and data.is_monotonic)
        assert p.attributes == tuple(vp.attributes[:]) and p.flags == vp.flags
        assert (values[p.start], values[p.time]) == (vp.start_time_unix_nano, vp.time_unix_nano)
        if isinstance(p, HistogramPoint):
            assert (values[p.count], values[p.sum], values[p.counts], p.bounds) == (
                vp.count, vp.sum, vp.bucket_counts, vp.explicit_bounds)
            assert [tuple(exemplar_values[i] for i in e) for e in p.exemplars] == [
                (e.trace_id, e.span_id, e.as_double, e.as_int, e.time_unix_nano) for e in vp.exemplars]
        else:
            assert (values[p.value] or 0) == (vp.as_double or vp.as_int)


def test_a_servers_exports_read_exactly_as_the_wire_view_reads_them():
    first, second, third = server_exports()
    layout = Layout.of(second)
    assert layout is not None and layout.num_points > 30
    assert any(p.exemplars for m in layout.metrics for p in m.points if isinstance(p, HistogramPoint))
    assert_reads_as_the_view(layout, second)
    assert_reads_as_the_view(layout, third)  # the next export: same shape, other values
    assert layout.values(third) != layout.values(second)
    assert first_resource(second) == view_points(second)[0][0].resource


def test_hand_built_points_of_every_kind_and_value_field():
    def build(t: int) -> bytes:
        metrics = [counter("c", 2.5, {"a": "x"}, time=t), gauge("g", 0.0, time=t),
                   counter("n", 3, monotonic=False, time=t),
                   histogram("h", [1, 0, 2], [1.0, 2.0], 4.5, {"k": "v"}, time=t,
                             exemplar=(b"\x01" * 16, b"\x02" * 8, 1.5))]
        ints = metrics_pb2.Metric(name="i", gauge=metrics_pb2.Gauge(data_points=[
            metrics_pb2.NumberDataPoint(time_unix_nano=t, as_int=-7), metrics_pb2.NumberDataPoint(time_unix_nano=t)]))
        return request([*metrics, ints])

    layout = Layout.of(build(2 * SEC))
    assert_reads_as_the_view(layout, build(2 * SEC))
    assert_reads_as_the_view(layout, build(3 * SEC))
    values = layout.values(build(3 * SEC))
    ints = [p for m in layout.metrics if m.name == "i" for p in m.points]
    assert values[ints[0].value] == -7 and ints[1].value == Layout.ZERO and values[Layout.ZERO] == 0


def test_only_a_payload_equal_but_for_its_moving_fields_has_the_layout():
    base = request([counter("c", 1.0, {"route": "/a"})])
    layout = Layout.of(base)
    assert layout.values(request([counter("c", 9.0, {"route": "/a"}, time=5 * SEC)])) is not None
    assert layout.values(request([counter("c", 1.0, {"route": "/b"})])) is None  # same length, other label
    assert layout.values(request([counter("d", 1.0, {"route": "/a"})])) is None  # other name
    assert layout.values(base + b"\x00") is None and layout.values(base[:-1]) is None
    assert layout.values(request([counter("c", 1.0, {"route": "/a"}, monotonic=False)])) is None


def _field(number: int, content: bytes) -> bytes:
    assert len(content) < 128
    return bytes([number << 3 | 2, len(content)]) + content


def _wrap(metric: bytes) -> bytes:
    return _field(1, _field(1, b"") + _field(2, _field(2, metric)))


def test_anything_but_a_plain_export_is_left_to_the_full_path():
    point = metrics_pb2.NumberDataPoint(time_unix_nano=SEC, as_double=1.0).SerializeToString()
    plain = _wrap(_field(1, b"g") + _field(5, _field(1, point)))
    assert Layout.of(plain) is not None and first_resource(plain) == b""
    exponential = metrics_pb2.Metric(name="e", exponential_histogram={"data_points": [{"count": 1}]})
    summary = metrics_pb2.Metric(name="s", summary={"data_points": [{"count": 1}]})
    cases = {
        "exponential histogram": request([exponential]),
        "summary": request([summary]),
        "unknown top-level field": plain + _field(9, b""),
        "metadata (an unknown metric field)": _wrap(_field(1, b"g") + _field(5, _field(1, point)) + _field(12, b"")),
        "a scalar twice": _wrap(_field(1, b"g") + _field(5, _field(1, point + b"\x19" + struct.pack("<Q", 2)))),
        "both value fields": _wrap(_field(1, b"g") + _field(5, _field(1, point + b"\x31" + struct.pack("<q", 2)))),
        "two data fields": _wrap(_field(1, b"g") + _field(5, _field(1, point)) + _field(5, b"")),
        "no data field": _wrap(_field(1, b"g")),
        "a name that is not UTF-8": _wrap(_field(1, b"\xff") + _field(5, _field(1, point))),
        "a length past the end": plain[:-3] + b"\x7f",
        "truncated": plain[:-1],
        "wrong wire type": _wrap(_field(1, b"g") + _field(5, _field(1, b"\x18\x01"))),
    }
    for why, payload in cases.items():
        assert Layout.of(payload) is None, why
    # each still parses (or is refused) with the full path; the layout only declines
    ExportMetricsServiceRequest.FromString(cases["metadata (an unknown metric field)"])


def test_first_resource_reads_only_the_leading_bytes():
    payload = request([gauge("g", 1.0)], service="svc")
    resource = wire.ExportMetricsServiceRequest.FromString(payload).resource_metrics[0].resource
    assert first_resource(payload) == resource and b"svc" in resource
    for not_a_request in (b"", b"\x12\x00", b"\x0a\x05\x0a", b"\x0a" + b"\xff" * 11 + b"\x01"):
        assert first_resource(not_a_request) is None
