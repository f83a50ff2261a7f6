"""The pipeline families against the released vLLM-Omni itself: its wheel on PyPI (`released_omni`,
downloaded once), every family otel-llm serves for a pipeline has the release's name, type, HELP,
labels and buckets, so a drift in either is caught here."""

from __future__ import annotations

import pytest

from otel_llm.canonical.instruments import Kind
from otel_llm.pipeline.families import FAMILIES
from tests.otel_llm.pipeline.released_omni import VERSION, families

PREFIX = "vllm_omni:"  # the release's


@pytest.fixture(scope="module")
def released():
    return families()


def test_the_release_declares_42_families_under_its_prefix(released):
    assert len(released) == 42, sorted(released)
    assert all(name.startswith(PREFIX) for name in released)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.stem)
def test_every_family_served_is_the_releases(released, family):
    theirs = released.get(PREFIX + family.stem)
    assert theirs is not None, f"vLLM-Omni {VERSION} declares no {PREFIX + family.stem}"
    assert theirs.kind == {Kind.COUNTER: "counter", Kind.GAUGE: "gauge", Kind.HISTOGRAM: "histogram"}[family.kind]
    assert theirs.labels == family.labels
    assert theirs.buckets == tuple(float(b) for b in family.buckets)
    assert theirs.help == family.help
