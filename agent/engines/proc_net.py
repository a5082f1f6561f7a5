"""Reading what ``/proc`` says about sockets and processes: pure functions of its text.

Which socket listens on an engine's port, and which processes hold it, are answered from
three files (``proc(5)``):

- ``/proc/net/tcp`` and ``/proc/net/tcp6``: one line per socket, with its local address and
  port, its state (``0A`` is LISTEN), the uid that created it and its inode;
- ``/proc/<pid>/fd/<n>``: a link whose target is ``socket:[<inode>]`` for a socket;
- ``/proc/<pid>/stat``: among others the parent pid, process group and session.

Nothing here reads a file: ``agent.engines.port_owner`` does, and these functions are tested
against recorded text.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Iterable, Mapping
from typing import NamedTuple

TCP_LISTEN = "0A"


class ListeningSocket(NamedTuple):
    address: str
    """The local address it is bound to, e.g. ``127.0.0.1`` or ``::``."""
    port: int
    uid: int
    """The user that created it."""
    inode: int


class ProcessFamily(NamedTuple):
    """Where one process stands: its parent, its process group and its session."""

    pid: int
    ppid: int
    pgrp: int
    session: int


def parse_listening(text: str) -> list[ListeningSocket]:
    """The listening sockets in the text of ``/proc/net/tcp`` or ``/proc/net/tcp6``.

    The header and any line that cannot be read are skipped. A socket that is not open in
    any process any more has inode 0: it is left out, nobody can hold it.
    """
    found: list[ListeningSocket] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        local, _, port_hex = fields[1].partition(":")
        try:
            address = _decode_address(local)
            port, uid, inode = int(port_hex, 16), int(fields[7]), int(fields[9])
        except ValueError:
            continue
        if inode:
            found.append(ListeningSocket(address, port, uid, inode))
    return found


def _decode_address(hex_words: str) -> str:
    """An address as the kernel prints it: 32-bit words in hex, each in host byte order."""
    if len(hex_words) not in (8, 32):
        raise ValueError(f"not an address: {hex_words!r}")
    packed = b"".join(
        int(hex_words[i : i + 8], 16).to_bytes(4, sys.byteorder)
        for i in range(0, len(hex_words), 8)
    )
    return str(ipaddress.ip_address(packed))


def socket_inode(link: str) -> int | None:
    """The inode of a ``socket:[<inode>]`` fd link target; None for any other file."""
    if not (link.startswith("socket:[") and link.endswith("]")):
        return None
    digits = link[len("socket:[") : -1]
    return int(digits) if digits.isdigit() else None


def parse_family(text: str) -> ProcessFamily:
    """Pid, parent, process group and session (fields 1, 4, 5, 6) from ``/proc/<pid>/stat``.

    Field 2, the command name, is in parentheses and may hold spaces and parentheses
    itself, so the fields after it are counted from its last closing parenthesis.
    """
    head, _, tail = text.rpartition(")")
    fields = tail.split()
    return ProcessFamily(
        pid=int(head.partition(" ")[0]),
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        session=int(fields[3]),
    )


def engine_family(leader: int, processes: Iterable[ProcessFamily]) -> set[int]:
    """Every process that belongs to the engine led by ``leader``: its session or process
    group (an engine leads both, and the workers it forks stay in them), and every
    descendant, also one that started a session of its own."""
    every = list(processes)
    members = {p.pid for p in every if leader in (p.pid, p.session, p.pgrp)}
    children: dict[int, list[int]] = {}
    for process in every:
        children.setdefault(process.ppid, []).append(process.pid)
    waiting = [leader, *members]
    while waiting:
        for child in children.get(waiting.pop(), ()):
            if child not in members:
                members.add(child)
                waiting.append(child)
    return members


class PortHolders(NamedTuple):
    """Who holds the sockets listening on one port."""

    ours: tuple[ListeningSocket, ...]
    """Held by a process of the engine."""
    foreign: tuple[tuple[ListeningSocket, tuple[int, ...]], ...]
    """Held by no process of the engine, each with the pids seen holding it (none when
    they cannot be seen, e.g. another user's)."""


def holders_of_port(
    port: int,
    listening: Iterable[ListeningSocket],
    engine_inodes: set[int],
    holders: Mapping[int, tuple[int, ...]],
) -> PortHolders:
    """Sort the sockets listening on ``port`` into the engine's (their inode is among
    ``engine_inodes``) and the others, with the pids ``holders`` names for each inode."""
    on_port = [s for s in listening if s.port == port]
    ours = tuple(s for s in on_port if s.inode in engine_inodes)
    foreign = tuple(
        (s, tuple(sorted(holders.get(s.inode, ()))))
        for s in on_port
        if s.inode not in engine_inodes
    )
    return PortHolders(ours=ours, foreign=foreign)
