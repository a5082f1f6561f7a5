"""Who holds an engine's port, read from a ``/proc`` laid out in a directory: the sockets
tables, each process's ``stat``, its ``cmdline`` and its fd links (symlinks whose target is
``socket:[<inode>]``, as the kernel shows them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.engines.port_owner import HeldElsewhere, NotListening, Owned, check_port_owner

pytestmark = pytest.mark.skipif(sys.byteorder != "little", reason="tables of a little-endian host")

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"  # noqa: E501
ENGINE, WORKER, OTHER, HIDDEN = 4000, 4001, 5000, 6000
PORT = 21007  # 0x520F


def listener(inode: int, uid: int = 0, address: str = "0100007F") -> str:
    return f"   0: {address}:520F 00000000:0000 0A 00000000:00000000 00:00000000 00000000 {uid:5}        0 {inode} 1 0 100 0 0 10 0\n"  # noqa: E501


class FakeProc:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "net").mkdir(parents=True)
        self.tables(tcp="", tcp6="")

    def tables(self, *, tcp: str, tcp6: str) -> None:
        (self.root / "net" / "tcp").write_text(HEADER + tcp)
        (self.root / "net" / "tcp6").write_text(HEADER + tcp6)

    def process(
        self, pid: int, *, ppid: int, pgrp: int, session: int, sockets: tuple[int, ...] = ()
    ) -> None:
        directory = self.root / str(pid)
        (directory / "fd").mkdir(parents=True)
        (directory / "stat").write_text(
            f"{pid} (python3) S {ppid} {pgrp} {session} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12345\n"
        )
        (directory / "cmdline").write_bytes(b"python3\0-m\0http.server\0")
        (directory / "fd" / "0").symlink_to("/dev/null")
        for fd, inode in enumerate(sockets, start=3):
            (directory / "fd" / str(fd)).symlink_to(f"socket:[{inode}]")

    def hidden(self, pid: int) -> None:
        """A process whose fds this agent may not read (another user's)."""
        directory = self.root / str(pid)
        directory.mkdir()
        (directory / "stat").write_text(
            f"{pid} (nc) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 0 0 1 0 9\n"
        )


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc")
    fake.process(ENGINE, ppid=1, pgrp=ENGINE, session=ENGINE)
    return fake


def test_nothing_listening_is_not_a_verdict_yet(proc: FakeProc) -> None:
    assert check_port_owner(PORT, ENGINE, proc.root) == NotListening()


def test_a_socket_the_engine_holds_is_its_own(proc: FakeProc) -> None:
    proc.tables(tcp=listener(77), tcp6="")
    (proc.root / str(ENGINE) / "fd" / "3").symlink_to("socket:[77]")

    assert check_port_owner(PORT, ENGINE, proc.root) == Owned()


def test_a_socket_a_forked_worker_holds_is_the_engines_too(proc: FakeProc) -> None:
    proc.process(WORKER, ppid=ENGINE, pgrp=WORKER, session=WORKER, sockets=(77, 78))
    proc.tables(tcp=listener(77), tcp6=listener(78, address="00000000000000000000000000000000"))

    assert check_port_owner(PORT, ENGINE, proc.root) == Owned()


def test_a_socket_of_another_process_is_named_with_its_pid_and_command(proc: FakeProc) -> None:
    proc.process(OTHER, ppid=1, pgrp=OTHER, session=OTHER, sockets=(88,))
    proc.tables(tcp=listener(88), tcp6="")

    assert check_port_owner(PORT, ENGINE, proc.root) == HeldElsewhere(
        f"port {PORT} is held by pid {OTHER}, not our engine (pid {OTHER}: python3 -m http.server)"
    )


def test_another_listener_beside_the_engines_own_is_still_refused(proc: FakeProc) -> None:
    (proc.root / str(ENGINE) / "fd" / "3").symlink_to("socket:[77]")
    proc.process(OTHER, ppid=1, pgrp=OTHER, session=OTHER, sockets=(88,))
    proc.tables(tcp=listener(77) + listener(88, address="0200007F"), tcp6="")

    verdict = check_port_owner(PORT, ENGINE, proc.root)

    assert isinstance(verdict, HeldElsewhere)
    assert verdict.reason.startswith(f"port {PORT} is held by pid {OTHER}, not our engine")


def test_a_holder_this_agent_cannot_see_is_named_by_the_user_owning_the_socket(
    proc: FakeProc,
) -> None:
    proc.hidden(HIDDEN)
    proc.tables(tcp=listener(99, uid=64999), tcp6="")

    assert check_port_owner(PORT, ENGINE, proc.root) == HeldElsewhere(
        f"port {PORT} is held by a process this agent cannot see (the socket on 127.0.0.1 "
        "belongs to uid 64999: another user's process?), not our engine"
    )


def test_tables_that_cannot_be_read_refuse_rather_than_guess(tmp_path: Path) -> None:
    verdict = check_port_owner(PORT, ENGINE, tmp_path / "no-proc")

    assert isinstance(verdict, HeldElsewhere)
    assert verdict.reason.startswith(f"cannot tell who listens on port {PORT}")
