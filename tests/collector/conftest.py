from collections.abc import Iterator

import pytest

from otel_llm.collector.receiver.otlp_http import OtlpReceiver
from tests.harness.fixtures import prometheus_server  # noqa: F401  (fixture)
from tests.harness.memory_sink import MemorySink


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def receiver(sink: MemorySink) -> Iterator[OtlpReceiver]:
    with OtlpReceiver(sink) as rx:
        yield rx
