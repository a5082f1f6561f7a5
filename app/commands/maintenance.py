"""``llmgw-server migrate`` and ``llmgw-server projections rebuild``."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated

import msgspec
import structlog
from cyclopts import Parameter

from app.commands.common import DatabaseUrl, fail
from app.logs import configure_logging
from app.store import migrate as migrations
from app.store.database import create_engine
from app.store.errors import StoreError
from app.store.rebuild import RebuildReport, rebuild

log = structlog.get_logger(__name__)


def migrate(*, database_url: DatabaseUrl) -> None:
    """Upgrade the database schema to the newest revision (safe to run repeatedly).

    Example: LLMGW_DATABASE_URL=postgresql://llmgw@db/llmgw llmgw-server migrate
    """
    configure_logging()
    try:
        migrations.upgrade(database_url)
    except (OSError, StoreError) as exc:
        fail(f"cannot migrate: {exc}")
    print(f"database at revision {migrations.head_revision()}")


def rebuild_command(
    *,
    database_url: DatabaseUrl,
    verify: bool = False,
    output: Annotated[str, Parameter(help="text or json")] = "text",
) -> None:
    """Replay the whole log into fresh projection tables.

    With --verify nothing is written: every row that differs between the replayed log and
    the live tables is reported, and the exit code is 1 if there is any.

    Example: llmgw-server projections rebuild --verify
    """
    configure_logging()
    report = asyncio.run(_rebuild(database_url, verify))
    if output == "json":
        print(msgspec.json.encode(report).decode())
    else:
        _print_report(report)
    if report.differences:
        sys.exit(1)


async def _rebuild(url: str, verify: bool) -> RebuildReport:
    engine = create_engine(url, pool_size=1)
    try:
        return await rebuild(engine, verify=verify)
    except StoreError as exc:
        fail(str(exc))
        raise
    finally:
        await engine.dispose()


def _print_report(report: RebuildReport) -> None:
    rows = ", ".join(f"{count} {table}" for table, count in report.rows.items())
    action = "rewrote" if report.rewritten else "verified"
    print(f"replayed {report.events} events (up to position {report.position}); {action} {rows}")
    for diff in report.differences:
        detail = "; ".join(
            f"{column}: table has {live!r}, log implies {wanted!r}"
            for column, (live, wanted) in diff.columns.items()
        )
        print(f"  {diff.table} {diff.key}: {diff.problem}{' (' + detail + ')' if detail else ''}")
    if not report.rewritten:
        count = len(report.differences)
        print(f"{count} difference(s)" if count else "no differences")
