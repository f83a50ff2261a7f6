"""Fixtures of the integration tests."""

from tests.harness.fixtures import prometheus_server  # noqa: F401  (fixture)
