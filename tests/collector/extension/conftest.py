"""A trace store in a temporary folder and the Jaeger query endpoint over it, for the API tests."""

import pytest

from otel_llm.collector.extension.jaeger_query import JaegerQueryApi
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig


@pytest.fixture
def store(tmp_path):
    s = TraceStore(TraceStoreConfig(str(tmp_path)))
    yield s
    s.close()


@pytest.fixture
def api(store):
    a = JaegerQueryApi(store, "127.0.0.1", 0)
    a.start()
    yield a
    a.stop()
