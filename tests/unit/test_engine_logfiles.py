"""An engine's log files across launches: the current one and at most three before it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.engines.errors import EngineLaunchError
from agent.engines.logfiles import KEPT_ENGINE_LOGS, earlier_log, rotate_log
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
