"""Process logs in the report of a failed test.

A fixture that starts processes names their logs with ``add_logs_to_failed_reports``; when
a report of the test (setup, call or teardown) fails, the hook in ``tests/conftest.py``
reads them into it as pytest makes it. That is before the report leaves the process that
ran the test, so the logs reach the terminal with ``pytest -n`` too, where the test ran in a
worker and a report changed later would never be seen.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

LogSource = tuple[str, Callable[[], str]]
LOG_SOURCES = pytest.StashKey[list[LogSource]]()


def add_logs_to_failed_reports(item: pytest.Item, title: str, read: Callable[[], str]) -> None:
    """Add ``read()`` as section ``title`` to every failed report of ``item``."""
    item.stash.setdefault(LOG_SOURCES, []).append((title, read))


def add_logs_if_failed(item: pytest.Item, report: pytest.TestReport) -> None:
    if report.failed:
        for title, read in item.stash.get(LOG_SOURCES, []):
            report.sections.append((title, read()))
