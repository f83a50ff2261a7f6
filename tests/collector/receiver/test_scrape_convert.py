"""A target's converter reuses the last body's plan when only values moved: the same request, byte for
byte, and the same errors as parsing every body in full; any other change (labels, help, types, series
come or gone, an odd value, OpenMetrics) is parsed in full again."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_llm.collector.receiver import scrape_convert
from otel_llm.collector.receiver.scrape_convert import Converter, ScrapeError

VLLM_TEXT = (Path(__file__).parents[1] / "data" / "vllm_metrics.txt").read_text()
HIST = ('# HELP h_seconds Latency.\n# TYPE h_seconds histogram\n'
        'h_seconds_bucket{le="0.1",m="a"} {b1}\nh_seconds_bucket{le="1.0",m="a"} {b2}\n'
        'h_seconds_bucket{le="+Inf",m="a"} {b3}\nh_seconds_count{m="a"} {b3}\nh_seconds_sum{m="a"} 4.5\n'
        '# TYPE requests_total counter\nrequests_total{m="a"} {n}\n'
        '# TYPE requests_created gauge\nrequests_created{m="a"} {created}\n'
        '# TYPE running gauge\nrunning{m="a"} {n}\n')


def body(b1=1, b2=2, b3=3, n=10, created="1.7e9") -> str:
    return HIST.replace("{b1}", str(b1)).replace("{b2}", str(b2)).replace("{b3}", str(b3)).replace(
        "{n}", str(n)).replace("{created}", created)


class Pair:
    """One converter as the receiver has it, and one that parses every body in full (its cache
    dropped before each), fed the same bodies at the same times."""

    def __init__(self, monkeypatch, **kwargs) -> None:
        self.cached = Converter("vllm", "10.0.0.5:8000", **kwargs)
        self.reference = Converter("vllm", "10.0.0.5:8000", **kwargs)
        self.parses = 0
        parse = scrape_convert.parse

        def counted(text, openmetrics):
            self.parses += 1
            return parse(text, openmetrics)
        monkeypatch.setattr(scrape_convert, "parse", counted)
        self.now_ns = 1_700_000_000 * 10**9

    def convert(self, text: str, openmetrics: bool = False):
        """-> (the request bytes or (reason, message) of the error, whether the cached one parsed)."""
        self.now_ns += 10**9
        outcomes = []
        for converter in (self.cached, self.reference):
            before = self.parses
            converter._skeleton = None if converter is self.reference else converter._skeleton
            try:
                outcomes.append(converter.convert(text, openmetrics, self.now_ns, {"up": 1.0}))
            except ScrapeError as exc:
                outcomes.append((exc.reason, str(exc)))
            if converter is self.cached:
                parsed = self.parses > before
        assert outcomes[0] == outcomes[1]
        assert self.cached.starts.keys() == self.reference.starts.keys()
        return outcomes[0], parsed


def moved(text: str, by: float) -> str:
    """Every sample's value (but `_created` ones) plus `by`."""
    return "\n".join(line if not line or line.startswith("#") or "_created" in line
                     else f"{line.rpartition(' ')[0]} {float(line.rpartition(' ')[2]) + by}"
                     for line in text.split("\n"))


def test_a_real_vllm_body_whose_values_move_is_parsed_once(monkeypatch):
    pair = Pair(monkeypatch)
    results = [pair.convert(moved(VLLM_TEXT, by)) for by in (0, 1, 2.5, 7)]
    assert [parsed for _, parsed in results] == [True, False, False, False]
    assert len({payload for payload, _ in results}) == 4  # (times and values differ)


@pytest.mark.parametrize("change", [
    ('le="1.0",m="a"', 'le="2.0",m="a"'),  # a label value
    ('running{m="a"}', 'running{m="b"}'),
    ("Latency.", "Request latency."),  # help
    ("# TYPE running gauge", "# TYPE running counter"),  # a family's type
    ("# TYPE requests_total counter", "# TYPE requests_total gauge"),
    ("# TYPE requests_created gauge\n", ""),  # `_created` no longer a start time
    ('h_seconds_sum{m="a"} 4.5\n', ""),  # a series gone
    ("# TYPE running gauge\n", "# TYPE running gauge\nrunning{m=\"b\"} 1\n"),  # a series more
])
def test_any_change_but_values_gets_a_new_plan_and_converts_as_a_full_parse(monkeypatch, change):
    pair = Pair(monkeypatch)
    assert pair.convert(body())[1] and not pair.convert(body(n=11))[1]
    changed = body(n=12).replace(*change)
    assert changed != body(n=12)
    assert pair.convert(changed)[1]  # parsed again
    assert not pair.convert(changed.replace(" 12\n", " 13\n"))[1]  # and that plan is reused in turn
    assert pair.convert(body(n=14))[1]  # back: parsed again


def test_start_times_follow_values_and_created_without_a_parse(monkeypatch):
    pair = Pair(monkeypatch)
    counter, histogram = ("requests", (("m", "a"),)), ("h_seconds", (("m", "a"),))
    pair.convert(body(n=10, created="1.7e9"))
    assert not pair.convert(body(n=6, created="1.8e9"))[1]  # a new `_created` (a restart): same plan
    assert pair.cached.starts[counter] == (1_800_000_000 * 10**9, 6)
    assert not pair.convert(body(b1=0, b2=0, b3=1))[1]  # the histogram's count went down: a restart
    assert pair.cached.starts[histogram] == (pair.now_ns, 1)


def test_values_that_break_the_exposition_give_the_same_errors_and_the_plan_survives(monkeypatch):
    pair = Pair(monkeypatch)
    pair.convert(body())
    error, parsed = pair.convert(body(b1=5, b2=2, b3=3))  # same shape, buckets not cumulative
    assert not parsed and error == ("malformed", 'histogram h_seconds{\'m\': \'a\'}: buckets not cumulative')
    error, parsed = pair.convert(body(b1=1, b2=2, b3="NaN"))  # a NaN count
    assert not parsed and error[0] == "malformed" and "NaN" in error[1]
    error, parsed = pair.convert(body(n="1_0"))  # not a value prometheus_client takes: parsed, its error
    assert parsed and error[0] == "malformed" and "Invalid value" in error[1]
    assert not pair.convert(body(n=3))[1]  # the plan is still there
    error, parsed = pair.convert(body().replace('le="+Inf"', 'le="9"'))  # no +Inf bucket: a family error
    assert parsed and error == ("malformed", "histogram h_seconds{'m': 'a'} has no +Inf bucket")
    assert not pair.convert(body().replace('le="+Inf"', 'le="9"'))[1]  # same error, from the plan


def test_an_error_of_the_families_comes_after_an_earlier_familys_error_of_values(monkeypatch):
    """A later family's bad `le` (found when planning) and an earlier family's non-cumulative
    buckets (found when filling): the earlier one is reported, as the conversion always did."""
    pair = Pair(monkeypatch)
    bad_le = '# TYPE z histogram\nz_bucket{le="x"} 1\nz_bucket{le="+Inf"} 1\n'
    error, _ = pair.convert(body(b1=5) + bad_le)
    assert error == ("malformed", "histogram h_seconds{'m': 'a'}: buckets not cumulative")
    error, parsed = pair.convert(body() + bad_le)
    assert not parsed and error[0] == "malformed" and "could not convert string to float: 'x'" in error[1]


def test_openmetrics_bodies_are_parsed_every_time(monkeypatch):
    pair = Pair(monkeypatch)
    om = '# TYPE a counter\na_total{x="1"} {n}\na_created{x="1"} 1.5e9\n# EOF\n'
    assert all(pair.convert(om.replace("{n}", str(n)), openmetrics=True)[1] for n in (1, 2))


def test_the_sample_limit_holds_whatever_was_cached(monkeypatch):
    pair = Pair(monkeypatch, sample_limit=8)
    assert isinstance(pair.convert(body())[0], bytes)  # 8 samples
    error, parsed = pair.convert(body() + "one_more 1\n")
    assert parsed and error[0] == "sample_limit"
    assert not pair.convert(body(n=2))[1]
