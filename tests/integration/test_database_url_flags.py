"""``serve`` and ``gateway`` refuse a database URL that cannot be one in one line, before
they connect to anything, and never echo its password; so too a gateway flag out of its
bounds, which both commands take."""

from __future__ import annotations

import subprocess

import pytest

from devcluster.processes import program

SERVER = program("llmgw-server")
MALFORMED = "postgresql://llmgw:hunter2@db-a:5432,,db-b:5432/llmgw?target_session_attrs=read-write"


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_a_malformed_database_url_is_refused_in_one_line(command: str) -> None:
    result = subprocess.run(
        [SERVER, command, "--database-url", MALFORMED],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"llmgw-server {command}: --database-url: "), result.stderr
    assert "an empty host" in lines[-1]
    assert "hunter2" not in result.stderr + result.stdout


@pytest.mark.parametrize("command", ["serve", "gateway"])
@pytest.mark.parametrize(
    ("flag", "value", "problem"),
    [
        ("--max-ejected-percent", "101", "--max-ejected-percent must be between 0 and 100"),
        ("--max-upload-mib", "0", "--max-upload-mib must be between 1 and 16384"),
        ("--shutdown-grace", "-1", "--shutdown-grace must be between 0 and 86400 seconds, not -1"),
        ("--shutdown-grace", "86401", "--shutdown-grace must be between 0 and 86400 seconds"),
        ("--shutdown-grace", "nan", "--shutdown-grace 'nan': expected a finite number"),
        ("--shutdown-grace", "inf", "--shutdown-grace 'inf': expected a finite number"),
    ],
)
def test_a_gateway_flag_out_of_bounds_is_refused_in_one_line(
    command: str, flag: str, value: str, problem: str
) -> None:
    result = subprocess.run(
        [SERVER, command, "--database-url", "postgresql://llmgw@db-a/llmgw", flag, value],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 2, result.stderr
    assert (
        result.stderr.strip().splitlines()[-1].startswith(f"llmgw-server {command}: {problem}")
    ), result.stderr
