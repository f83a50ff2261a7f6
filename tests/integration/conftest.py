"""Fixtures of the integration tests."""

from tests.harness.fixtures import prometheus_server  # noqa: F401  (fixture)

_SLO_TEST = "test_slo_prometheus.py"


def pytest_runtest_setup(item) -> None:
    """The SLO scenario's two minutes of load (until its alert fires) run beside the integration tests
    before it: started when the first integration test starts, if the session runs it."""
    if any(i.fspath.basename == _SLO_TEST for i in item.session.items):
        from tests.integration.test_slo_prometheus import SCENARIO

        SCENARIO.start_in_background()
