"""``llmgw-agent stop-engines`` given a state directory that is not one: a typo is refused
(exit 2) naming the path, before any directory is stopped or written to; a state directory
with no engines says so (exit 0). Stopping real engines is told in
``tests/integration/test_stopped_engine.py`` and ``test_agent_process.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.command_line import EXIT_OK, EXIT_USAGE
from agent.main import app
from agent.state_dir import LOCK_FILE

HINT = "give the state directory of the agent whose engines to stop"


def an_agents_state_dir(parent: Path) -> Path:
    """A state directory an agent ran on, and which started no engine: only its lock."""
    state_dir = parent / "gpu-07"
    state_dir.mkdir()
    (state_dir / LOCK_FILE).write_text("4242\n")
    return state_dir


def stop_engines(*args: str) -> object:
    return app(["stop-engines", *args], result_action="return_value")


def test_a_state_directory_that_does_not_exist_is_refused_naming_it_and_stops_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = an_agents_state_dir(tmp_path)
    typo = tmp_path / "gpu-7"

    assert stop_engines("--state-dir", str(real), "--state-dir", str(typo)) == EXIT_USAGE

    out, err = capsys.readouterr()
    assert err == f"llmgw-agent stop-engines: --state-dir {typo}: no such directory; {HINT}\n"
    assert out == "", "the directories before the typo are not stopped either"
    assert not typo.exists()


def test_a_directory_no_agent_ran_on_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--state-dir /var/lib`` for ``/var/lib/llmgw-agent``: nothing is recorded there, and
    the lock a stop takes must not be written into it."""
    (tmp_path / "unrelated.txt").write_text("kept\n")

    assert stop_engines("--state-dir", str(tmp_path)) == EXIT_USAGE

    assert capsys.readouterr().err == (
        f"llmgw-agent stop-engines: --state-dir {tmp_path}: not an agent's state directory "
        f"(no {LOCK_FILE}, no shard records); {HINT}\n"
    )
    assert [path.name for path in tmp_path.iterdir()] == ["unrelated.txt"]


def test_a_file_given_as_the_state_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "agent.toml"
    a_file.write_text("")

    assert stop_engines("--state-dir", str(a_file)) == EXIT_USAGE

    assert capsys.readouterr().err == (
        f"llmgw-agent stop-engines: --state-dir {a_file}: not a directory; {HINT}\n"
    )


def test_a_state_directory_from_the_environment_that_does_not_exist_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "gpu-7"
    monkeypatch.setenv("LLMGW_AGENT_STATE_DIR", str(typo))

    assert stop_engines() == EXIT_USAGE

    assert capsys.readouterr().err == (
        f"llmgw-agent stop-engines: the state directory {typo}: no such directory; {HINT}\n"
    )
    assert not typo.exists()


def test_a_state_directory_without_engines_says_so_and_succeeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = an_agents_state_dir(tmp_path)

    assert stop_engines("--state-dir", str(state_dir)) == EXIT_OK

    assert capsys.readouterr() == (f"{state_dir}: no engines recorded\n", "")
