"""Fixtures of the end-to-end scenarios: a PKI issued once per session, a PostgreSQL
database per test, and a ``Cluster`` of real processes whose logs join the report of a
failed test and which is reaped, passed or failed. Every test here is marked ``e2e``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import ClusterPki, cluster, issue_pki
from tests.support.databases import database_url, engine, migrated_template, pg_store
from tests.support.real_engine import real_engine

__all__ = ["cluster", "database_url", "engine", "migrated_template", "pg_store", "real_engine"]

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPki:
    """The CA and the server certificate; node certificates are issued as nodes start."""
    return issue_pki(tmp_path_factory.mktemp("e2e-pki"))
