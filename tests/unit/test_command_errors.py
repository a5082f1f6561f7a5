"""An error a command finds itself, once its command line is parsed, is one line on stderr
that starts as its usage errors do, ``PROGRAM COMMAND: what is wrong``, with the command's
own exit code. (``test_usage_errors.py`` tells the usage errors.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

import agent.main
import app.main

UNREACHABLE = "postgresql://llmgw@127.0.0.1:1/llmgw"
"""Never reached: each error below is found before the database is asked anything."""


@pytest.fixture(autouse=True)
def logging_left_as_found() -> Iterator[None]:
    """Each command configures this process's logging first; the next test gets it back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)
    structlog.reset_defaults()


def ended(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    """The exit code of ``llmgw-server ARGV`` and what it wrote on stderr."""
    with pytest.raises(SystemExit) as end:
        app.main.app(argv)
    return end.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "code", "line"),
    [
        (
            ["log", "verify", "--database-url", UNREACHABLE, "--anchor", "7"],
            2,
            "llmgw-server log verify: --anchor: an anchor is POSITION:HASH",
        ),
        (
            ["log", "head", "--database-url", UNREACHABLE, "--output", "xml"],
            2,
            "llmgw-server log head: --output is text or json, not 'xml'",
        ),
        (
            ["log", "head", "--database-url", "postgresql://llmgw@db-a:5432,,db-b/x"],
            2,
            "llmgw-server log head: --database-url: ",
        ),
        (
            ["log", "verify", "--database-url", UNREACHABLE, "--answer-timeout", "0"],
            2,
            "llmgw-server log verify: --answer-timeout must be positive, not 0",
        ),
        (
            ["log", "head", "--database-url", UNREACHABLE, "--answer-timeout", "-5"],
            2,
            "llmgw-server log head: --answer-timeout must be positive, not -5",
        ),
        (
            ["migrate", "--database-url", UNREACHABLE, "--answer-timeout", "1e9"],
            2,
            "llmgw-server migrate: --answer-timeout must be at most 86400 seconds, not 1e+09",
        ),
        (
            ["projections", "rebuild", "--database-url", UNREACHABLE, "--answer-timeout", "0"],
            2,
            "llmgw-server projections rebuild: --answer-timeout must be positive, not 0",
        ),
        (
            ["projections", "rebuild", "--database-url", UNREACHABLE, "--output", "xml"],
            2,
            "llmgw-server projections rebuild: --output is text or json, not 'xml'",
        ),
        (
            ["gateway", "--database-url", UNREACHABLE, "--engine-networks", "127.0.0.0/33"],
            2,
            "llmgw-server gateway: --engine-networks: ",
        ),
        (
            ["serve", "--database-url", UNREACHABLE],
            2,
            "llmgw-server serve: the agent hub needs --tls-cert, --tls-key and --tls-ca",
        ),
        (
            ["gateway", "--database-url", UNREACHABLE, "--gateway-id", ""],
            2,
            "llmgw-server gateway: --gateway-id (or LLMGW_GATEWAY_ID) is blank: give a name",
        ),
        (
            ["gateway", "--database-url", UNREACHABLE, "--gateway-id", "   "],
            2,
            "llmgw-server gateway: --gateway-id (or LLMGW_GATEWAY_ID) is blank: give a name",
        ),
        (
            ["serve", "--database-url", UNREACHABLE, "--server-id", "  "],
            2,
            "llmgw-server serve: --server-id (or LLMGW_SERVER_ID) is blank: give a name",
        ),
    ],
)
def test_a_server_command_names_itself_on_its_error_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, line: str
) -> None:
    exit_code, err = ended(argv, capsys)

    assert exit_code == code
    assert err.startswith(line), err
    assert err.splitlines(keepends=True) == [err], "one line"
    assert err.endswith("\n")


@pytest.mark.parametrize(
    ("command", "variable", "flag"),
    [("gateway", "LLMGW_GATEWAY_ID", "--gateway-id"), ("serve", "LLMGW_SERVER_ID", "--server-id")],
)
def test_an_id_variable_set_empty_is_refused_at_start_not_taken_for_the_default(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    variable: str,
    flag: str,
) -> None:
    monkeypatch.setenv(variable, "")

    assert ended([command, "--database-url", UNREACHABLE], capsys) == (
        2,
        f"llmgw-server {command}: {flag} (or {variable}) is blank: give a name, or leave it "
        "unset for the default\n",
    )


def test_migrate_names_itself_on_its_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    password = tmp_path / "password"
    password.write_text("secret\n")

    assert ended(
        ["migrate", "--database-url", UNREACHABLE, "--runtime-password-file", str(password)],
        capsys,
    ) == (
        2,
        "llmgw-server migrate: --runtime-password-file needs --runtime-role "
        "(LLMGW_RUNTIME_ROLE): the password is set on the role it names\n",
    )


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--gateway-password-file", "{password}"],
            "--gateway-password-file needs --gateway-role (LLMGW_GATEWAY_ROLE)",
        ),
        (
            ["--runtime-role", "llmgw_x", "--gateway-role", "llmgw_x"],
            '"llmgw_x" cannot be both the runtime and the gateway role',
        ),
        (["--runtime-role", ""], "--runtime-role: a role name has 1 to 63 bytes, not 0"),
        (["--gateway-role", "x" * 64], "--gateway-role: a role name has 1 to 63 bytes, not 64"),
        (["--runtime-role", "pg_monitor"], "--runtime-role: 'pg_monitor' cannot be a role name"),
        (
            ["--runtime-role", "llmgw_x", "--runtime-password-file", "{missing}"],
            "cannot read the runtime password file {missing}: No such file or directory",
        ),
        (
            ["--runtime-role", "llmgw_x", "--runtime-password-file", "/dev/zero"],
            "the runtime password file /dev/zero is over 4 KiB",
        ),
        (
            ["--database-url", "postgresql://llmgw@db-a:5432,,db-b/llmgw"],
            "--database-url: the database URL 'postgresql://llmgw@db-a:5432,,db-b/llmgw' has "
            "an empty host in its list of hosts",
        ),
    ],
    ids=[
        "gateway-password-without-role",
        "one-role-as-both",
        "empty-role-name",
        "role-name-too-long",
        "reserved-role-name",
        "missing-password-file",
        "password-file-too-large",
        "malformed-database-url",
    ],
)
def test_migrate_refuses_flags_it_cannot_run_with_as_bad_usage_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], line: str
) -> None:
    """Exit 2, as every usage error (docs/operations.md): the URL given is never reached,
    so a failure to connect (exit 1) would show the flags were not checked first."""
    password = tmp_path / "password"
    password.write_text("secret\n")
    paths = {"password": str(password), "missing": str(tmp_path / "missing")}

    url = [] if "--database-url" in flags else ["--database-url", UNREACHABLE]

    code, err = ended(["migrate", *url, *(flag.format(**paths) for flag in flags)], capsys)

    assert (code, err.splitlines()) == (2, [err.rstrip("\n")]), err
    assert err.startswith(f"llmgw-server migrate: {line.format(**paths)}"), err


def test_what_the_error_line_holds_reaches_the_terminal_as_visible_escapes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A value that would clear the screen or move the cursor is shown, not obeyed."""
    code, err = ended(
        ["gateway", "--database-url", UNREACHABLE, "--engine-networks", "\x1b[2J\r\n"], capsys
    )

    assert code == 2
    assert err.startswith("llmgw-server gateway: --engine-networks: "), err
    assert err.splitlines(keepends=True) == [err], "one line"
    assert "\x1b" not in err


def test_an_unknown_log_level_ends_the_command_in_one_line_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert ended(["gateway", "--database-url", UNREACHABLE, "--log-level", "loud"], capsys) == (
        2,
        "llmgw-server gateway: log level 'loud': expected one of debug, info, warning, error\n",
    )


def test_an_agent_subcommand_names_itself_on_its_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = agent.main.app(["stop-engines", "--grace=-1"], result_action="return_value")

    assert code == agent.main.EXIT_USAGE
    assert capsys.readouterr().err == (
        "llmgw-agent stop-engines: --grace -1.0: expected 0 or more seconds\n"
    )
