"""A flag whose value is a secret shows in ``ps`` for every local user: the help of each
such flag says so and names where else to give it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def flat_help(program: str, *command: str) -> str:
    shown = subprocess.run(
        [str(Path(sys.executable).with_name(program)), *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
    )
    return " ".join(shown.stdout.replace("│", " ").split())


@pytest.mark.parametrize(
    ("command", "flag", "instead"),
    [
        (("serve",), "--admin-tokens", "set $LLMGW_ADMIN_TOKENS"),
        (("serve",), "--database-url", "give the URL in $LLMGW_DATABASE_URL"),
        (("gateway",), "--database-url", "give the URL in $LLMGW_DATABASE_URL"),
        (("migrate",), "--database-url", "the password in ~/.pgpass or $PGPASSWORD"),
    ],
)
def test_a_secret_flags_help_steers_away_from_the_process_list(
    command: tuple[str, ...], flag: str, instead: str
) -> None:
    shown = flat_help("llmgw-server", *command)
    said = shown[shown.rindex(flag) :]  # its row of the parameters, after the usage

    assert "visible to other local users in the process list" in said[:400]
    assert instead in said[:400]
