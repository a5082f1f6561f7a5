"""A program imports the module of the command it runs, not every command's: its command
line alone loads none of the libraries its commands need (the HTTP client, the
certificate library, the web framework, the database driver). ``llmgw-cli nodes`` and
``llmgw-server log verify`` start faster for it (``benchmarks/command_start.py``).

Each program is imported in a fresh interpreter, as its entry point imports it."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("program", "left_to_its_commands"),
    [
        (
            "app.main",
            ("litestar", "sqlalchemy", "alembic", "asyncpg", "app.bootstrap", "app.gateway"),
        ),
        ("cli.main", ("httpx", "cryptography", "cli.client", "cli.drain", "cli.cert")),
    ],
)
def test_a_programs_command_line_imports_none_of_its_commands(
    program: str, left_to_its_commands: tuple[str, ...]
) -> None:
    code = (
        f"import sys, {program}\n"
        f"print(' '.join(m for m in {left_to_its_commands!r} if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )

    assert loaded.stdout.split() == []
