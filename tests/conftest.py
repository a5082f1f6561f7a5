from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import ExitStack

import pytest
from hypothesis import HealthCheck, settings

from tests.support.ports import claimed_ports, release_claims_since
from tests.support.postgres import PostgresServer, provide_postgres
from tests.support.reports import add_logs_if_failed
from tests.support.stub_admin import RecordingAdmin, recording_admin_api

# The property tests check what holds, never how fast: speed is measured by benchmarks/,
# side by side with a baseline. On a loaded machine hypothesis's timing checks (a 200 ms
# deadline per example, a health check on how fast examples are drawn) fail a test whose
# property holds, so this suite turns them off for every test at once.
settings.register_profile("llmgw", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("llmgw")


@pytest.fixture(scope="session")
def postgres_server(pytestconfig: pytest.Config) -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session; tests create their own databases on it."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with ExitStack() as stack:
        with capture.global_and_fixture_disabled():  # the log says which server was chosen
            server = stack.enter_context(provide_postgres())
        yield server


@pytest.fixture(autouse=True)
def _release_the_tests_ports() -> Iterator[None]:
    """The ports a test claims (``tests.support.ports.free_port``) are released once it and
    its function fixtures are done: set up before them, this is torn down after them."""
    earlier = claimed_ports()
    yield
    release_claims_since(earlier)


@pytest.fixture
def recording_admin(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingAdmin]:
    """A stub admin API that notes the requests the CLI sends it and refuses each."""
    with recording_admin_api(monkeypatch) as recording:
        yield recording


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    add_logs_if_failed(item, report)
    return report
