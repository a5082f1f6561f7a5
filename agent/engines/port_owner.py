"""Whether the sockets listening on an engine's port belong to that engine.

An answer on ``127.0.0.1:<port>`` proves only that *something* listens there: on a machine
shared with another cluster, or with any other program, it may be somebody else's server,
and an engine that then fails to bind would have been reported ready by its answer. So
before a shard is ready, every socket listening on its port (IPv4 and IPv6, any address)
must be open in a process of the engine: the session and process group it leads, or one
of its descendants (``agent.engines.proc_net.engine_family``).

Linux only, like the rest of engine supervision: it reads ``/proc`` of the agent's own
network namespace, the one its readiness checks go through.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.engines.proc_listing import PROC, process_ids
from agent.engines.proc_net import (
    ListeningSocket,
    PortHolders,
    ProcessFamily,
    engine_family,
    holders_of_port,
    parse_family,
    parse_listening,
    socket_inode,
)

TCP_TABLES = ("net/tcp", "net/tcp6")


@dataclass(frozen=True)
class Owned:
    """Every socket listening on the port is the engine's."""


@dataclass(frozen=True)
class NotListening:
    """Nothing listens on the port (yet, or any more)."""


@dataclass(frozen=True)
class HeldElsewhere:
    """Something else listens on the port; ``reason`` says who, for the operator."""

    reason: str


PortOwnership = Owned | NotListening | HeldElsewhere


def check_port_owner(port: int, engine_pid: int, proc: Path = PROC) -> PortOwnership:
    """Who listens on ``port``, as seen from the engine led by ``engine_pid``."""
    try:
        listening = [s for table in TCP_TABLES for s in _listening(proc / table) if s.port == port]
    except OSError as exc:
        return HeldElsewhere(f"cannot tell who listens on port {port}: {exc}")
    if not listening:
        return NotListening()
    wanted = {s.inode for s in listening}
    if wanted <= set(_socket_inodes(proc, engine_pid)):
        return Owned()  # the engine's leader holds them all: no other process to read
    family = engine_family(engine_pid, _families(proc))
    ours = {inode for pid in family for inode in _socket_inodes(proc, pid) if inode in wanted}
    foreign = wanted - ours
    if not foreign:
        return Owned()
    seen = _holders(proc, foreign, exclude=family)
    return HeldElsewhere(describe_holders(port, holders_of_port(port, listening, ours, seen), proc))


def describe_holders(port: int, holders: PortHolders, proc: Path = PROC) -> str:
    """``port N is held by pid M, not our engine`` and what M runs, or why no pid is named."""
    socket, pids = holders.foreign[0]
    if pids:
        held_by = f"pid {pids[0]}" if len(pids) == 1 else f"pids {', '.join(map(str, pids))}"
        commands = "; ".join(f"pid {pid}: {_command(proc, pid)}" for pid in pids)
        return f"port {port} is held by {held_by}, not our engine ({commands})"
    return (
        f"port {port} is held by a process this agent cannot see (the socket on "
        f"{socket.address} belongs to {_user(socket.uid)}: another user's process?), "
        "not our engine"
    )


def _listening(path: Path) -> list[ListeningSocket]:
    try:
        return parse_listening(path.read_text())
    except FileNotFoundError:
        if path.name == "tcp6":
            return []  # a kernel without IPv6
        raise


def _families(proc: Path) -> Iterator[ProcessFamily]:
    for entry in process_ids(proc):
        try:
            yield parse_family((proc / str(entry) / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not readable


def _socket_inodes(proc: Path, pid: int) -> Iterator[int]:
    directory = proc / str(pid) / "fd"
    try:
        fds = os.listdir(directory)
    except OSError:
        return  # gone, or not ours to read
    for fd in fds:
        try:
            inode = socket_inode(os.readlink(directory / fd))
        except OSError:
            continue
        if inode is not None:
            yield inode


def _holders(proc: Path, inodes: set[int], exclude: Iterable[int]) -> dict[int, tuple[int, ...]]:
    """The pids (of the ones this agent may look into) that hold each of ``inodes``."""
    skip = set(exclude)
    found: dict[int, list[int]] = {}
    for pid in process_ids(proc):
        if pid in skip:
            continue
        for inode in _socket_inodes(proc, pid):
            if inode in inodes:
                found.setdefault(inode, []).append(pid)
    return {inode: tuple(pids) for inode, pids in found.items()}


def _command(proc: Path, pid: int) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "gone"
    words = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    return words[:120] or "no command line"


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"
