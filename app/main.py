"""llmgw-server: the control plane and its maintenance commands."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Annotated

import msgspec
import uvicorn
from cyclopts import App, Parameter

from app.admin.app import create_admin_app
from app.admin.auth import TokenAuthenticator, parse_tokens
from app.logs import configure_logging
from app.store import migrate as migrations
from app.store.database import create_engine
from app.store.errors import StoreError
from app.store.postgres import PostgresEventStore
from app.store.rebuild import RebuildReport, rebuild

app = App(
    name="llmgw-server",
    help="The llmgw control plane: event store, agent hub, reconciler, admin API, gateway.",
)
projections = App(name="projections", help="Maintain the tables projected from the event log.")
app.command(projections)

DatabaseUrl = Annotated[
    str,
    Parameter(
        env_var="LLMGW_DATABASE_URL",
        help="PostgreSQL URL, e.g. postgresql://llmgw@db:5432/llmgw.",
    ),
]


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


@app.command
def migrate(*, database_url: DatabaseUrl) -> None:
    """Upgrade the database schema to the newest revision (safe to run repeatedly).

    Example: LLMGW_DATABASE_URL=postgresql://llmgw@db/llmgw llmgw-server migrate
    """
    configure_logging()
    try:
        migrations.upgrade(database_url)
    except (OSError, StoreError) as exc:
        _fail(f"cannot migrate: {exc}")
    print(f"database at revision {migrations.head_revision()}")


@projections.command(name="rebuild")
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
        _fail(str(exc))
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


@app.command
def serve(
    *,
    database_url: DatabaseUrl,
    admin_host: Annotated[str, Parameter(env_var="LLMGW_ADMIN_HOST")] = "127.0.0.1",
    admin_port: Annotated[int, Parameter(env_var="LLMGW_ADMIN_PORT")] = 8081,
    admin_tokens: Annotated[
        str, Parameter(env_var="LLMGW_ADMIN_TOKENS", help="NAME:TOKEN pairs, comma-separated")
    ] = "",
    log_level: Annotated[str, Parameter(env_var="LLMGW_LOG_LEVEL")] = "info",
) -> None:
    """Run the control plane (admin API on the admin listener).

    Example: LLMGW_ADMIN_TOKENS=ci:$(openssl rand -hex 16) llmgw-server serve
    """
    configure_logging(log_level)
    try:
        tokens = parse_tokens(admin_tokens or os.environ.get("LLMGW_ADMIN_TOKEN_PAIRS", ""))
    except ValueError as exc:
        _fail(str(exc))
        return
    asyncio.run(_serve(database_url, admin_host, admin_port, TokenAuthenticator(tokens)))


async def _serve(url: str, host: str, port: int, authenticator: TokenAuthenticator) -> None:
    engine = create_engine(url)
    store = PostgresEventStore(engine)
    await store.catch_up()
    admin = create_admin_app(store, authenticator)
    server = uvicorn.Server(
        uvicorn.Config(admin, host=host, port=port, log_config=None, access_log=False)
    )
    try:
        await server.serve()
    finally:
        await engine.dispose()


def main() -> None:
    app()
