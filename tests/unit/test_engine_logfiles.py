"""An engine's log files across launches: the current one and at most three before it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from agent.engines.errors import EngineLaunchError
from agent.engines.logfiles import KEPT_ENGINE_LOGS, earlier_log, forget_ended_logs, rotate_log
from agent.engines.processes import spawn_engine


def launch(path: Path, number: int) -> None:
    """What a launch does to the log: moves it aside, then the engine writes a new one."""
    rotate_log(path)
    path.write_text(f"launch {number}\n")


def test_the_first_launch_has_no_log_to_move_aside(tmp_path: Path) -> None:
    path = tmp_path / "m-1-0.log"

    rotate_log(path)

    assert list(tmp_path.iterdir()) == []


def test_a_crash_loop_keeps_the_current_log_and_the_three_before_it(tmp_path: Path) -> None:
    path = tmp_path / "m-1-0.log"

    for number in range(1, 11):
        launch(path, number)

    assert KEPT_ENGINE_LOGS == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "m-1-0.log",
        "m-1-0.log.1",
        "m-1-0.log.2",
        "m-1-0.log.3",
    ]
    assert path.read_text() == "launch 10\n"
    assert [earlier_log(path, n).read_text() for n in (1, 2, 3)] == [
        "launch 9\n",
        "launch 8\n",
        "launch 7\n",
    ]


def test_a_gap_in_the_earlier_logs_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "m-1-0.log"
    path.write_text("current\n")
    earlier_log(path, 2).write_text("two launches ago\n")

    rotate_log(path)

    assert not path.exists()
    assert earlier_log(path, 1).read_text() == "current\n"
    assert earlier_log(path, 3).read_text() == "two launches ago\n"


def test_keeping_none_only_drops_the_log(tmp_path: Path) -> None:
    path = tmp_path / "m-1-0.log"
    path.write_text("current\n")

    rotate_log(path, keep=0)

    assert list(tmp_path.iterdir()) == []


def test_a_log_on_a_full_disk_fails_the_launch_naming_the_log_not_the_program(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m-1-0.log"
    path.symlink_to("/dev/full")  # every write fails with ENOSPC, as on a full disk

    with pytest.raises(EngineLaunchError) as raised:
        spawn_engine([sys.executable, "-c", "pass"], {}, path)

    assert str(raised.value) == (
        f"cannot write the engine log: [Errno 28] No space left on device: '{path}'"
    )


def ended_shard(logs: Path, stem: str, written_at: float, launches: int = 1) -> None:
    """The logs a shard left: its last launch's and those before it, written at a time."""
    for name in [f"{stem}.log", *(f"{stem}.log.{n}" for n in range(1, launches))]:
        path = logs / name
        path.write_text("engine output\n")
        os.utime(path, (written_at, written_at))


def test_the_logs_of_shards_ended_long_ago_go_the_last_ended_and_the_live_stay(
    tmp_path: Path,
) -> None:
    """Replica ids are never used again: an agent that runs for months would otherwise keep
    the logs of every shard it ever ran."""
    for n in range(300):
        ended_shard(tmp_path, f"m-{n}-0", written_at=1_000_000 + n, launches=1 + n % 4)
    ended_shard(tmp_path, "my.model-1-0", written_at=5_000_000, launches=2)
    ended_shard(tmp_path, "live-1-0", written_at=1, launches=4)
    (tmp_path / "notes.txt").write_text("not a log\n")

    deleted = forget_ended_logs(tmp_path, {"live-1-0"}, keep=100)

    left = {path.name for path in tmp_path.iterdir()}
    stems_left = {re.sub(r"\.log(\.[0-9]+)?$", "", name) for name in left - {"notes.txt"}}
    newest = {f"m-{n}-0" for n in range(201, 300)}
    assert stems_left == newest | {"my.model-1-0", "live-1-0"}
    assert {"live-1-0.log", "live-1-0.log.3", "my.model-1-0.log.1", "notes.txt"} <= left
    assert len(deleted) == sum(1 + n % 4 for n in range(201))
    assert forget_ended_logs(tmp_path, {"live-1-0"}, keep=100) == []


def test_an_engine_log_is_for_the_agents_user_alone_even_one_an_older_agent_wrote(
    tmp_path: Path,
) -> None:
    """The log names the engine's command and the engine may print its settings (a key
    among them): under a umask of 022 it was 0644, for every local user to read."""
    fresh, older = tmp_path / "m-1-0.log", tmp_path / "m-2-0.log"
    older.write_text("written by an older agent\n")
    older.chmod(0o644)
    umask = os.umask(0o022)
    try:
        spawn_engine([sys.executable, "-c", "pass"], {}, fresh)
        spawn_engine([sys.executable, "-c", "pass"], {}, older)
    finally:
        os.umask(umask)

    assert (fresh.stat().st_mode & 0o777, older.stat().st_mode & 0o777) == (0o600, 0o600)
