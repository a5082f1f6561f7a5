from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.support.postgres import PostgresServer, provide_postgres


@pytest.fixture(scope="session")
def postgres_server(pytestconfig: pytest.Config) -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session; tests create their own databases on it."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with ExitStack() as stack:
        with capture.global_and_fixture_disabled():  # the log says which server was chosen
            server = stack.enter_context(provide_postgres())
        yield server
