"""A program imports the module of the command it runs, not every command's: its command
line alone loads none of the libraries its commands need (the HTTP client, the
certificate library, the web framework, the database driver). ``llmgw-cli nodes`` and
``llmgw-server log verify`` start faster for it (``benchmarks/command_start.py``).

Each program is imported in a fresh interpreter, as its entry point imports it."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, as a program's entry point runs."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )


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
    loaded = run_python(code)

    assert loaded.stdout.split() == []


def test_a_command_over_http_loads_no_certificate_library() -> None:
    """``llmgw-cli nodes`` against an http admin URL never speaks TLS, so it loads neither
    ``cryptography`` nor the package metadata (only ``--version`` reads it); TLS errors,
    certificate files and ``https`` load them when they come."""
    code = (
        "import sys\n"
        "from cli.main import main\n"
        "sys.argv = ['llmgw-cli', 'nodes', '--admin-url', 'http://127.0.0.1:9']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(m for m in ('cryptography', 'importlib.metadata') if m in sys.modules))"
    )
    loaded = run_python(code)

    assert "cannot reach the admin API" in loaded.stderr
    assert loaded.stdout.split() == []


def test_the_commands_that_check_the_schema_at_start_load_no_alembic() -> None:
    """``serve``, ``gateway`` and ``log`` read the schema's revision at every start (and
    ``/readyz`` at every probe) from what Alembic wrote, without Alembic: only ``migrate``
    and ``projections`` load it."""
    code = (
        "import sys, app.commands.serve, app.commands.gateway, app.commands.log\n"
        "print(' '.join(m for m in sys.modules if m.split('.')[0] == 'alembic'))"
    )
    loaded = run_python(code)

    assert loaded.stdout.split() == []
