"""Fixtures for the API server tests (helpers live in `api_server_harness`)."""

import pytest
from api_server_harness import ServerProcess


@pytest.fixture(scope="session")
def shared_server():
    """One multiprocess server for tests that do not need exact global counts."""
    server = ServerProcess().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(sink):
    """A server exporting its spans to `sink` (a module's own; modules may define their own `server`)."""
    srv = sink.server()
    yield srv
    srv.stop()
