"""Where an ExportMetricsServiceRequest's values lie in its bytes: to know a sender's next export by its shape.

A sender exports the same resource, scopes, metrics and attribute sets every interval; only the
values move: timestamps, numbers, counts, sums, bucket counts, exemplars. Nearly every field that
moves is fixed-width on the wire (fixed64, double, sfixed64; packed fixed64 bucket counts and the
8- and 16-byte span and trace ids keep their lengths), so the next export is the same bytes but
for those fields, at the same offsets. `Layout.of` walks one export's wire format once and records
every point (its resource, scope, metric, attributes, flags and bucket bounds, exactly as the
wire view `metrics_wire` reads them) and where its moving fields lie; `Layout.values` then takes
another payload and, when every byte outside those fields is the same, unpacks the moving fields
with one `struct` call, without parsing: the same bytes but for fixed-width values parse to the
same structure, so the caller's work for the first export (series found, routes chosen) holds.

Exactness: only a plain export is laid out. Each field number and wire type is the one
opentelemetry-proto declares; a scalar or a message's singular field appears at most once; a
metric has exactly one data field, a gauge, sum or (explicit-bucket) histogram. Anything else
(an unknown field, exponential histograms, summaries, a duplicate, a string that is not UTF-8)
gives None, and the caller takes the full path for it every time.
"""

from __future__ import annotations

import struct
from operator import itemgetter
from typing import NamedTuple

import numpy as np

_VARINT, _I64, _LEN = 0, 1, 2  # wire types


class NumberPoint(NamedTuple):
    attributes: tuple[bytes, ...]  # each KeyValue's bytes, as `tuple(point.attributes[:])` of the view
    flags: int
    start: int  # indexes into `Layout.values`' tuple (`Layout.ZERO`/`Layout.ZERO_FLOAT` when absent)
    time: int
    value: int


class HistogramPoint(NamedTuple):
    attributes: tuple[bytes, ...]
    flags: int
    bounds: bytes  # explicit_bounds as packed on the wire
    start: int
    time: int
    count: int
    sum: int
    counts: int  # bucket_counts' bytes (`Layout.EMPTY` when absent or empty)
    exemplars: tuple[tuple[int, int, int, int, int], ...]  # each Exemplar's (trace_id, span_id, as_double,
    # as_int, time_unix_nano) indexes into `Layout.exemplar_values`' tuple


_INDEXES = {NumberPoint: ("start", "time", "value"), HistogramPoint: ("start", "time", "count", "sum", "counts")}


class Metric(NamedTuple):
    resource: bytes
    scope: bytes
    name: str
    kind: str  # "gauge", "sum" or "histogram"
    monotonic: bool
    temporality: int  # 0 (unspecified) for gauges, as the view reads an absent field
    points: tuple  # NumberPoint or HistogramPoint, in wire order


class Layout:
    """One export's shape: its metrics in wire order, and how to read another payload of the same shape."""

    ZERO, ZERO_FLOAT, EMPTY = -3, -2, -1  # the constants `values` appends (0, 0.0, b"")

    def __init__(self, size: int, keep: np.ndarray, fixed: bytes, unpack: struct.Struct,
                 unpack_exemplars: struct.Struct, metrics: tuple[Metric, ...]) -> None:
        self.size, self._keep, self._fixed = size, keep, fixed
        self._unpack, self._unpack_exemplars = unpack, unpack_exemplars
        self.metrics = metrics
        self.num_points = sum(len(m.points) for m in metrics)

    @classmethod
    def of(cls, payload: bytes) -> Layout | None:
        """`payload`'s layout, or None when it is not a plain export (see the module's docstring)."""
        walk = _Walk(payload)
        try:
            metrics = walk.request()
        except (_NotPlain, IndexError, UnicodeDecodeError):
            return None
        moving = sorted(walk.moving, key=itemgetter(0))  # (no two fields start at one byte)
        edges = np.zeros(len(payload) + 1, np.int32)  # +1 where a moving field starts, -1 after it
        np.add.at(edges, [m[0] for m in moving], 1)
        np.add.at(edges, [m[1] for m in moving], -1)
        keep = np.where(np.cumsum(edges[:-1]) > 0, 0, 0xFF).astype(np.uint8)
        final: dict[int, int] = {}  # a value's index in the walk's order -> in its struct's
        unpack = [_struct([m for m in moving if m[3] not in walk.exemplar_values], len(payload), final),
                  _struct([m for m in moving if m[3] in walk.exemplar_values], len(payload), final)]
        fixed = (np.frombuffer(payload, np.uint8) & keep).tobytes()
        metrics = [m._replace(points=tuple(_final(p, final) for p in m.points)) for m in metrics]
        return cls(len(payload), keep, fixed, *unpack, tuple(metrics))

    def values(self, payload: bytes) -> tuple | None:
        """The moving fields of `payload` (in the order the points index them, then 0, 0.0 and b"") when it
        has this layout's shape, else None."""
        if len(payload) != self.size or (np.frombuffer(payload, np.uint8) & self._keep).tobytes() != self._fixed:
            return None
        return self._unpack.unpack(payload) + (0, 0.0, b"")

    def exemplar_values(self, payload: bytes) -> tuple:
        """The exemplars' fields of a payload `values` took (as `HistogramPoint.exemplars` index them)."""
        return self._unpack_exemplars.unpack(payload) + (0, 0.0, b"")


def _struct(moving: list[tuple], size: int, final: dict[int, int]) -> struct.Struct:
    """A struct reading these moving fields of a payload of `size` bytes (in order; the rest padding);
    their indexes in it go into `final`."""
    codes, at = [], 0
    for start, end, code, index in moving:
        if code is not None:
            codes.append(f"{start - at}x{code}" if start > at else code)
            final[index], at = len(codes) - 1, end
    return struct.Struct("<" + "".join(codes) + f"{size - at}x")


def _final(point, final: dict[int, int]):
    """A point (or an exemplar's indexes) with its values' indexes in walk order made indexes in the payload's."""
    if type(point) is tuple:
        return tuple(final.get(i, i) for i in point)
    changed = {f: final.get(getattr(point, f), getattr(point, f)) for f in _INDEXES[type(point)]}
    if isinstance(point, HistogramPoint):
        changed["exemplars"] = tuple(_final(e, final) for e in point.exemplars)
    return point._replace(**changed)


def first_resource(payload: bytes) -> bytes | None:
    """The first ResourceMetrics' resource bytes when the payload starts with them (as every SDK writes
    it), else None: a sender's key for its last layout, found without parsing."""
    try:
        at = 0
        for _ in range(2):  # request field 1 (a ResourceMetrics), then its field 1 (the resource)
            if payload[at] != 0x0A:
                return None
            length, at = _varint(payload, at + 1)
        return payload[at:at + length]
    except (IndexError, _NotPlain):
        return None


class _NotPlain(Exception):
    pass


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise _NotPlain


class _Walk:
    """One pass over a payload: its metrics, and where every moving field lies."""

    def __init__(self, payload: bytes) -> None:
        self.data = payload
        self.moving: list[tuple[int, int, str | None, int]] = []  # (start, end, code, index in walk order)
        self.exemplar_values: set[int] = set()  # the indexes of exemplars' fields (their own struct's)

    def fields(self, start: int, end: int, allowed: dict[int, int]):
        """(number, start, end) of each field in data[start:end]: a varint's bytes, a fixed64's 8, a
        length-delimited field's content. `allowed`: number -> wire type; any other field is not plain."""
        data, at = self.data, start
        while at < end:
            key = data[at]  # (one-byte varints, nearly every key and length, read inline)
            key, at = (key, at + 1) if key < 0x80 else _varint(data, at)
            number, wire = key >> 3, key & 7
            if allowed.get(number) != wire:
                raise _NotPlain
            if wire == _I64:
                after = at + 8
            elif wire == _LEN:
                length = data[at]
                length, at = (length, at + 1) if length < 0x80 else _varint(data, at)
                after = at + length
            else:
                _, after = _varint(data, at)
            if after > end:
                raise _NotPlain
            yield number, at, after
            at = after
        if at != end:
            raise _NotPlain

    def singles(self, start: int, end: int, allowed: dict[int, int], repeated: tuple[int, ...] = ()):
        """The fields of data[start:end] by number: (start, end) of each singular one (at most once), a
        list of them for the `repeated` numbers."""
        found: dict[int, object] = {n: [] for n in repeated}
        for number, at, after in self.fields(start, end, allowed):
            if number in repeated:
                found[number].append((at, after))
            elif number in found:
                raise _NotPlain
            else:
                found[number] = (at, after)
        return found

    def move(self, span: tuple[int, int] | None, code: str | None, constant: int) -> int:
        """Mark a field as moving; -> its index among the values in walk order (`constant` when absent
        or not unpacked: `code` None)."""
        if span is None:
            return constant
        self.moving.append((span[0], span[1], code, len(self.moving)))
        return constant if code is None else len(self.moving) - 1

    def varint(self, span) -> int:
        return 0 if span is None else _varint(self.data, span[0])[0]

    def request(self) -> list[Metric]:
        data, metrics = self.data, []
        for _, start, end in self.fields(0, len(data), {1: _LEN}):
            rm = self.singles(start, end, {1: _LEN, 2: _LEN, 3: _LEN}, repeated=(2,))
            resource = data[slice(*rm[1])] if 1 in rm else b""
            for sm_start, sm_end in rm[2]:
                sm = self.singles(sm_start, sm_end, {1: _LEN, 2: _LEN, 3: _LEN}, repeated=(2,))
                scope = data[slice(*sm[1])] if 1 in sm else b""
                metrics.extend(self.metric(resource, scope, *span) for span in sm[2])
        return metrics

    def metric(self, resource: bytes, scope: bytes, start: int, end: int) -> Metric:
        m = self.singles(start, end, {1: _LEN, 2: _LEN, 3: _LEN, 5: _LEN, 7: _LEN, 9: _LEN})
        kinds = [kind for number, kind in ((5, "gauge"), (7, "sum"), (9, "histogram")) if number in m]
        if len(kinds) != 1:
            raise _NotPlain
        kind = kinds[0]
        name = self.data[slice(*m[1])].decode() if 1 in m else ""
        data_fields = {1: _LEN} if kind == "gauge" else {1: _LEN, 2: _VARINT, 3: _VARINT} if kind == "sum" else {
            1: _LEN, 2: _VARINT}
        d = self.singles(*m[{"gauge": 5, "sum": 7, "histogram": 9}[kind]], data_fields, repeated=(1,))
        point = self.histogram_point if kind == "histogram" else self.number_point
        return Metric(resource, scope, name, kind, kind == "sum" and self.varint(d.get(3)) != 0,
                      self.varint(d.get(2)), tuple(point(*span) for span in d[1]))

    def number_point(self, start: int, end: int) -> NumberPoint:
        p = self.singles(start, end, {2: _I64, 3: _I64, 4: _I64, 5: _LEN, 6: _I64, 7: _LEN, 8: _VARINT},
                         repeated=(5, 7))
        if 4 in p and 6 in p:
            raise _NotPlain  # both of the value's oneof
        value = self.move(p.get(4), "d", Layout.ZERO) if 4 in p else self.move(p.get(6), "q", Layout.ZERO)
        point = NumberPoint(self.attributes(p[7]), self.varint(p.get(8)), self.move(p.get(2), "Q", Layout.ZERO),
                            self.move(p.get(3), "Q", Layout.ZERO), value)
        self.exemplars(p[5])
        return point

    def histogram_point(self, start: int, end: int) -> HistogramPoint:
        p = self.singles(start, end, {2: _I64, 3: _I64, 4: _I64, 5: _I64, 6: _LEN, 7: _LEN, 8: _LEN, 9: _LEN,
                                      10: _VARINT, 11: _I64, 12: _I64}, repeated=(8, 9))
        counts = p.get(6)
        point = HistogramPoint(
            self.attributes(p[9]), self.varint(p.get(10)), self.data[slice(*p[7])] if 7 in p else b"",
            self.move(p.get(2), "Q", Layout.ZERO), self.move(p.get(3), "Q", Layout.ZERO),
            self.move(p.get(4), "Q", Layout.ZERO), self.move(p.get(5), "d", Layout.ZERO_FLOAT),
            self.move(counts, f"{counts[1] - counts[0]}s", Layout.EMPTY) if counts and counts[1] > counts[0]
            else Layout.EMPTY,
            self.exemplars(p[8], True))
        for number in (11, 12):  # min and max: the store does not read them
            self.move(p.get(number), None, 0)
        return point

    def exemplars(self, spans: list[tuple[int, int]], read: bool = False) -> tuple:
        """Mark the exemplars' fields moving; `read`: -> each one's (trace_id, span_id, as_double, as_int,
        time_unix_nano) indexes (its filtered attributes stay in the shape; the store does not read them)."""
        out = []
        for start, end in spans:
            e = self.singles(start, end, {2: _I64, 3: _I64, 4: _LEN, 5: _LEN, 6: _I64, 7: _LEN}, repeated=(7,))
            if 3 in e and 6 in e:
                raise _NotPlain  # both of the value's oneof
            ids = [self.move(span, f"{span[1] - span[0]}s" if read and span and span[1] > span[0] else None,
                             Layout.EMPTY) for span in (e.get(5), e.get(4))]
            out.append((*ids, self.move(e.get(3), "d" if read else None, Layout.ZERO_FLOAT),
                        self.move(e.get(6), "q" if read else None, Layout.ZERO),
                        self.move(e.get(2), "Q" if read else None, Layout.ZERO)))
            self.exemplar_values.update(i for i in out[-1] if i >= 0)
        return tuple(out)

    def attributes(self, spans: list[tuple[int, int]]) -> tuple[bytes, ...]:
        data = self.data
        return tuple(data[start:end] for start, end in spans)
