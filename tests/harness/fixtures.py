"""pytest fixtures for real-component tests.

Use from a conftest: ``pytest_plugins = ["tests.harness.fixtures"]``.
"""

from collections.abc import Callable, Iterator

import pytest

from tests.harness.ports import free_port
from tests.harness.prometheus import PrometheusServer


@pytest.fixture
def prometheus_server() -> Iterator[Callable[..., PrometheusServer]]:
    """Factory: ``prometheus_server("127.0.0.1:PORT", **kwargs)`` -> a started server.

    Every server started through the factory is stopped at teardown.
    """
    started: list[PrometheusServer] = []

    def start(target: str | None, **kwargs: object) -> PrometheusServer:
        server = PrometheusServer(target, **kwargs)  # type: ignore[arg-type]
        server.start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture
def unused_port() -> int:
    """A free loopback TCP port (see ``free_port`` for the race it carries)."""
    return free_port()
