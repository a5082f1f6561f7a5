"""``llmgw-server projections rebuild`` refuses what it cannot use in one line, before it
connects: a database URL that is not one, an output it does not write; and, once connected,
a role that may not rewrite the tables."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from tests.support.cluster import SERVER
from tests.support.databases import runtime_url

COMMAND = [SERVER, "projections", "rebuild"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--database-url", "postgresql://llmgw:hunter2@db-a:5432,,db-b/x"],
            "llmgw-server projections rebuild: "
            "--database-url: the database URL 'postgresql://llmgw:***@db-a:5432,,db-b/x' "
            "has an empty host in its list of hosts",
        ),
        (
            ["--database-url", "postgresql://llmgw@127.0.0.1:1/x", "--output", "xml"],
            "llmgw-server projections rebuild: --output is text or json, not 'xml'",
        ),
    ],
)
def test_what_it_cannot_use_is_refused_in_one_line(flags: list[str], message: str) -> None:
    done = subprocess.run(
        [*COMMAND, *flags], capture_output=True, text=True, check=False, timeout=60
    )

    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.splitlines() == [message], done.stderr


async def test_rewriting_as_the_runtime_role_is_refused_in_one_line_saying_who_may(
    database_url: str,
) -> None:
    """The runtime role may read the projection tables, not truncate them: rebuilding
    without --verify is the owner's work, and the line says so (not a traceback)."""
    done = await asyncio.to_thread(
        subprocess.run,
        [*COMMAND, "--database-url", runtime_url(database_url)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )

    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.splitlines() == [
        "llmgw-server projections rebuild: permission denied for table models; rebuilding "
        "writes the projection tables directly: run it as the role that owns them (the one "
        "that runs migrate), or use --verify"
    ], done.stderr
