"""Fixtures shared by the server's test folders."""

import pytest

from tests.server.api.api_server_harness import TraceSink


@pytest.fixture(scope="module")
def sink():
    """An OTLP/HTTP traces endpoint keeping every span (a module's own)."""
    s = TraceSink()
    yield s
    s.shutdown()
