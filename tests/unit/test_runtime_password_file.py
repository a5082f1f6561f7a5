"""`llmgw-server migrate --runtime-password-file FILE` sets the runtime role's password to
the file's first line; a file it cannot use is refused naming it, and nothing is set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.commands.maintenance import runtime_password
from app.main import app
from tests.support.waiting import open_fifo_writer_briefly, outcome_within


def test_the_first_line_is_the_password_and_the_file_beats_the_environment(
    tmp_path: Path,
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("s3cret ünï\nignored\n")

    assert runtime_password(password_file, {"LLMGW_RUNTIME_PASSWORD": "env"}) == "s3cret ünï"
    assert runtime_password(None, {"LLMGW_RUNTIME_PASSWORD": "env"}) == "env"
    assert runtime_password(None, {}) is None


def test_a_password_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    password_file = tmp_path / "password"
    password_file.write_bytes(b"s3cret\xff\n")

    with pytest.raises(ValueError, match="is not UTF-8") as refused:
        runtime_password(password_file, {})

    assert str(refused.value) == (
        f"the runtime password file {password_file} is not UTF-8 text (byte 0xff at offset 6)"
    )


def test_a_device_is_refused_by_its_size_rather_than_read_whole() -> None:
    with pytest.raises(ValueError, match="/dev/zero is over 4 KiB: it holds one line"):
        runtime_password(Path("/dev/zero"), {})


def test_a_fifo_no_program_writes_to_is_refused_at_once(tmp_path: Path) -> None:
    # Before, migrate waited in the open of the FIFO for a writer for ever.
    fifo = tmp_path / "password"
    os.mkfifo(fifo)

    refused = outcome_within(
        lambda: runtime_password(fifo, {}),
        unblock=lambda: open_fifo_writer_briefly(fifo),
        what="reading a FIFO as the password file",
    )

    assert isinstance(refused, ValueError)
    assert str(refused) == (
        f"cannot read the runtime password file {fifo}: a named pipe (FIFO) that no program "
        "writes to: give a file, or a pipe a command writes to such as <(command)"
    )


def test_a_password_given_as_a_pipe_a_command_writes_to_is_read() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"s3cret\n")
    os.close(write_end)
    try:
        assert runtime_password(Path(f"/dev/fd/{read_end}"), {}) == "s3cret"
    finally:
        os.close(read_end)


def test_a_directory_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"cannot read the runtime password file {tmp_path}: "):
        runtime_password(tmp_path, {})


@pytest.mark.parametrize(
    ("flag", "env_var"),
    [
        ("--runtime-password-file", "LLMGW_RUNTIME_PASSWORD_FILE"),
        ("--gateway-password-file", "LLMGW_GATEWAY_PASSWORD_FILE"),
    ],
)
def test_a_password_file_given_empty_is_bad_usage_naming_it_not_the_current_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str, env_var: str
) -> None:
    monkeypatch.setenv(env_var, "")
    migrate = ["migrate", "--database-url", "postgresql://llmgw@db.example/llmgw"]

    with pytest.raises(SystemExit) as from_the_environment:
        app.parse_args(migrate)
    with pytest.raises(SystemExit) as from_the_flag:
        app.parse_args([*migrate, flag, " "])

    assert (from_the_environment.value.code, from_the_flag.value.code) == (2, 2)
    err = capsys.readouterr().err
    assert f"{flag} ({env_var}) is empty: give a path, or unset it" in err
    assert f"{flag} ({env_var}) is empty: give a path, or leave the flag out" in err
