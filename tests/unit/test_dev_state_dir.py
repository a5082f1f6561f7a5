"""One ``llmgw-dev`` per state directory: a second run on a directory another run holds is
refused in one line before it starts anything. Run through, it would share the first
run's PostgreSQL, stand by behind its server, write the engine-port block over the first
run's, and stop that PostgreSQL when it ends: the first cluster would lose its database."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

import pytest

from devcluster.dev import DevOptions, run_dev
from devcluster.errors import DevError
from devcluster.main import dev
from devcluster.ports import LOOPBACK
from devcluster.state_lock import lock_state_dir
from tests.support.ports import free_port

UNREACHABLE_DATABASE = "postgresql://llmgw@127.0.0.1:1/llmgw"
"""Were the run to go past the state directory, it would fail here, and quickly."""


def test_a_second_dev_on_a_state_directory_in_use_is_refused_before_it_starts_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_DATABASE_URL", UNREACHABLE_DATABASE)
    options = DevOptions(tmp_path, free_port(), free_port(), replicas=2, client_port=free_port())
    with (tmp_path / "dev.lock").open("w") as held:  # as the running llmgw-dev holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"{os.getpid()}\n")
        held.flush()

        code = run_dev(options)

    assert code == 1
    assert capsys.readouterr().err == (
        f"llmgw-dev: another llmgw-dev (pid {os.getpid()}) runs on {tmp_path}: stop it first, "
        "or give this one a --state-dir of its own\n"
    )
    assert [path.name for path in tmp_path.iterdir()] == ["dev.lock"], "nothing was started"


def test_the_state_directory_is_free_again_once_a_run_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        in_use = taken.getsockname()[1]
        options = DevOptions(tmp_path, in_use, free_port(), replicas=2, client_port=free_port())

        assert run_dev(options) == 1  # past the state directory, refused at the port

    assert capsys.readouterr().err == (
        f"llmgw-dev: port {in_use} on 127.0.0.1 is in use; choose another with --admin-port\n"
    )
    with (tmp_path / "dev.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while another holds it


def test_a_state_directory_that_cannot_be_made_is_named_with_its_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_DATABASE_URL", UNREACHABLE_DATABASE)
    (tmp_path / "a-file").write_text("not a directory\n")
    state_dir = tmp_path / "a-file" / "dev"
    options = DevOptions(state_dir, free_port(), free_port(), replicas=2, client_port=free_port())

    code = run_dev(options)

    assert capsys.readouterr().err == (
        f"llmgw-dev: the state directory {state_dir} cannot be used: Not a directory; give one "
        "you can write with --state-dir\n"
    )
    assert code == 1


def test_a_state_directory_that_is_a_fifo_is_refused_as_one(tmp_path: Path) -> None:
    # Before, "cannot be used: File exists", of a path that is no directory.
    fifo = tmp_path / "dev"
    os.mkfifo(fifo)

    with pytest.raises(DevError) as refused:
        lock_state_dir(fifo)

    assert str(refused.value) == (
        f"the state directory {fifo} cannot be used: not a directory but a named pipe (FIFO); "
        "give one you can write with --state-dir"
    )


def test_a_lock_file_that_is_a_fifo_is_refused_as_one(tmp_path: Path) -> None:
    # Before, "cannot be used: File or stream is not seekable."
    os.mkfifo(tmp_path / "dev.lock")

    with pytest.raises(DevError) as refused:
        lock_state_dir(tmp_path)

    assert str(refused.value) == (
        f"the state directory {tmp_path} cannot be used ({tmp_path / 'dev.lock'}): not a "
        "regular file but a named pipe (FIFO); give one you can write with --state-dir"
    )


@pytest.mark.parametrize("below", [False, True], ids=["the-link", "a-directory-in-it"])
def test_a_state_directory_given_as_a_link_to_nothing_is_refused_naming_both(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    below: bool,
) -> None:
    # Before, the link was followed and its target made: an empty state directory where the
    # operator meant the one the link used to point at.
    monkeypatch.setenv("LLMGW_DATABASE_URL", UNREACHABLE_DATABASE)
    target = tmp_path / "gone"
    link = tmp_path / "dev"
    link.symlink_to(target)
    state_dir = link / "cluster" if below else link

    code = dev(
        state_dir=state_dir,
        admin_port=free_port(),
        agent_port=free_port(),
        client_port=free_port(),
    )

    where = f" ({link})" if below else ""
    assert capsys.readouterr().err == (
        f"llmgw-dev: the state directory {state_dir} cannot be used{where}: a symbolic link "
        f"to {target}, which does not exist; give one you can write with --state-dir\n"
    )
    assert code == 1
    assert not target.exists(), "the link's target was made"
