"""Helpers for tests against real components (Prometheus server, promtool).

Import the pytest fixtures with ``pytest_plugins = ["tests.harness.fixtures"]``
in a conftest, or ``from tests.harness.fixtures import prometheus_server``.
"""

from tests.harness.ports import free_port
from tests.harness.prometheus import PrometheusError, PrometheusServer, PromtoolError, promtool_check_metrics

__all__ = [
    "PrometheusError",
    "PrometheusServer",
    "PromtoolError",
    "free_port",
    "promtool_check_metrics",
]
