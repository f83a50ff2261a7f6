"""A text exposition's skeleton: a body shaped as the last one gives its values as prometheus_client reads
them; any other change (a label, help, type, a line more or less) or an odd line gives None."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_llm.collector.receiver.scrape_skeleton import Skeleton, read_values

VLLM_TEXT = (Path(__file__).parents[1] / "data" / "vllm_metrics.txt").read_text()
BODY = ('# HELP a_total Requests.\n# TYPE a_total counter\na_total{x="1"} 5\na_total{x="2"} 7.5\n'
        '# TYPE g gauge\ng{s="sp ace",b="br}ace",q="q\\"uote{"} 2\ng 1e3\n\n# a comment\n')


def parsed(text: str) -> list:
    return [s.value for fam in text_string_to_metric_families(text) for s in fam.samples]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


@pytest.mark.parametrize("text", [BODY, VLLM_TEXT])
def test_a_body_with_only_its_values_moved_gives_them_as_prometheus_client_reads_them(text):
    skeleton = Skeleton.of(text, parsed(text))
    assert skeleton is not None and same(skeleton.values(text), parsed(text))
    moved = "\n".join(line if not line or line.startswith("#") else f"{line.rpartition(' ')[0]} {i}.25"
                      for i, line in enumerate(text.split("\n")))
    assert moved != text and same(skeleton.values(moved), parsed(moved))


@pytest.mark.parametrize("change", [
    ('a_total{x="2"}', 'a_total{x="3"}'),  # a label value
    ('{x="2"}', '{x="2",y="1"}'),  # a label more
    ("Requests.", "Requests served."),  # help
    ("# TYPE g gauge", "# TYPE g untyped"),  # type
    ("# TYPE a_total counter", "# TYPE a_total gauge"),
    ('a_total{x="2"} 7.5\n', ""),  # a series gone
    ("\n\n", "\nnew_series 1\n"),  # a series more
    ("# a comment\n", ""),  # a line less
    ("g 1e3", "g 1e3 1700000000000"),  # a timestamp
])
def test_any_change_but_a_value_does_not_match(change):
    skeleton = Skeleton.of(BODY, parsed(BODY))
    changed = BODY.replace(*change)
    assert changed != BODY
    assert skeleton.values(changed) is None


@pytest.mark.parametrize("line", [
    "m 1 1700000000000",  # timestamped: the last token is not the value
    "  m 1",  # indented
    "m 1\r",  # CRLF
    "m\t1",  # a tab
    '{__name__="m"} 1',  # the name as a label
    'm{a="1"} 1 # {trace_id="x"} 2',  # an exemplar
])
def test_lines_of_another_shape_are_not_taken(line):
    text = f"{line}\nother 2\n"
    assert Skeleton.of(text, parsed(text)) is None


@pytest.mark.parametrize("token, want", [
    ("5", 5), ("-0", 0), ("-0.0", -0.0), ("12345678901234567890", 12345678901234567890), ("1.5e-3", 1.5e-3),
    ("NaN", math.nan), ("+Inf", math.inf), ("-Inf", -math.inf), ("Inf", math.inf), (".5", 0.5), ("+5", 5),
    ("1e400", math.inf),
])
def test_values_are_read_as_prometheus_clients_parser_reads_them(token, want):
    [mine] = read_values([token])
    [theirs] = parsed(f"m {token}\n")
    for got in (mine, theirs):
        assert got == want or (math.isnan(got) and math.isnan(want))
    assert math.copysign(1, mine) == math.copysign(1, theirs)  # -0 is an int 0, -0.0 a negative zero
    if type(mine) is not type(theirs):  # an integer read as a float: only where the two are equal
        assert isinstance(theirs, int) and abs(theirs) < 2 ** 53 and mine == theirs


@pytest.mark.parametrize("token", ["1_0", "", "x", "0x10", "1,2", "true"])
def test_what_prometheus_client_refuses_is_not_read(token):
    assert read_values(["1", token]) is None
    with pytest.raises(ValueError):
        parsed(f"m {token}\n")
