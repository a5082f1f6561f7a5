"""Reading ``/proc`` text: listening sockets, fd links, process families, port holders.

The tables below were recorded on a Linux 6.x x86-64 machine with an engine listening on
127.0.0.1:21007 (one connection waiting in its accept queue, whose socket has inode 0),
a dual-stack ``[::]:21007`` and ``[::1]:21008``; the uid of one line was changed to 1000.
"""

from __future__ import annotations

import sys

import pytest

from agent.engines.proc_net import (
    ListeningSocket,
    ProcessFamily,
    engine_family,
    holders_of_port,
    parse_family,
    parse_listening,
    socket_inode,
)

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:520F 00000000:0000 0A 00000000:00000001 00:00000000 00000000     0        0 22573 2 00000000f8a4b6f0 100 0 0 10 0
   1: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 508 1 00000000b738cb71 100 0 0 10 0
   2: 0100007F:AF88 0100007F:520F 01 00000000:00000000 00:00000000 00000000     0        0 22576 2 000000000c2f9111 20 0 0 10 -1
   3: 0100007F:520F 0100007F:AF88 01 00000000:00000000 00:00000000 00000000     0        0 0 1 00000000d0ee15be 20 0 0 10 -1
"""  # noqa: E501

TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:520F 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 22574 1 0000000050cfc5be 100 0 0 10 0
   1: 00000000000000000000000001000000:5210 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 22575 1 000000009839066e 100 0 0 10 0
"""  # noqa: E501

little_endian = pytest.mark.skipif(
    sys.byteorder != "little", reason="recorded on a little-endian machine"
)


@little_endian
def test_only_listening_sockets_are_read_with_their_address_port_uid_and_inode() -> None:
    assert parse_listening(TCP) == [
        ListeningSocket("127.0.0.1", 21007, 0, 22573),
        ListeningSocket("0.0.0.0", 2024, 1000, 508),
    ]


@little_endian
def test_ipv6_listeners_are_read_too() -> None:
    assert parse_listening(TCP6) == [
        ListeningSocket("::", 21007, 0, 22574),
        ListeningSocket("::1", 21008, 0, 22575),
    ]


def test_lines_that_cannot_be_read_are_skipped() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt uid ...\n"
        "   0: 0100007F 00000000:0000 0A 0:0 00:0 0 0 0 1\n"
        "   1: XYZ:520F 00000000:0000 0A 0:0 00:0 0 0 0 1\n"
        "   2: 0100007F:520F 00000000:0000 0A 0:0 00:0 0 zero 0 1\n"
        "   3: 0100007F:520F\n"
        "garbage\n"
        "   4: 0100007F:0050 00000000:0000 0A 0:0 00:0 0 0 0 77\n"
    )

    assert [s.inode for s in parse_listening(text)] == [77]


def test_an_empty_table_has_no_listeners() -> None:
    assert parse_listening("") == []
    assert parse_listening(TCP.splitlines()[0]) == []


@pytest.mark.parametrize(
    ("link", "inode"),
    [
        ("socket:[22573]", 22573),
        ("socket:[]", None),
        ("socket:[12a]", None),
        ("pipe:[22573]", None),
        ("/dev/null", None),
        ("anon_inode:[eventpoll]", None),
    ],
)
def test_only_socket_links_name_an_inode(link: str, inode: int | None) -> None:
    assert socket_inode(link) == inode


def test_a_stat_line_gives_pid_parent_group_and_session_whatever_the_command_name() -> None:
    text = "4321 (python3 (a) b) S 4000 4321 4321 0 -1 4194560 1234 0 0 0 5 2 0 0 20 0 3 0 98765"

    assert parse_family(text) == ProcessFamily(pid=4321, ppid=4000, pgrp=4321, session=4321)


def test_the_engine_family_is_its_session_its_group_and_every_descendant() -> None:
    processes = [
        ProcessFamily(pid=100, ppid=1, pgrp=100, session=100),  # the engine: leads both
        ProcessFamily(pid=101, ppid=100, pgrp=100, session=100),  # a worker it forked
        ProcessFamily(pid=102, ppid=1, pgrp=100, session=100),  # an orphaned worker
        ProcessFamily(pid=103, ppid=101, pgrp=103, session=103),  # a worker's own session
        ProcessFamily(pid=104, ppid=103, pgrp=103, session=103),  # ... and its child
        ProcessFamily(pid=200, ppid=1, pgrp=200, session=200),  # somebody else
        ProcessFamily(pid=201, ppid=200, pgrp=200, session=200),
        ProcessFamily(pid=300, ppid=1, pgrp=300, session=100),  # its own group, our session
    ]

    assert engine_family(100, processes) == {100, 101, 102, 103, 104, 300}


def test_a_family_whose_leader_is_gone_is_what_stays_in_its_session() -> None:
    processes = [ProcessFamily(pid=101, ppid=1, pgrp=100, session=100)]

    assert engine_family(100, processes) == {101}


def test_the_sockets_on_a_port_are_sorted_into_the_engines_and_the_others() -> None:
    listening = [
        ListeningSocket("127.0.0.1", 21007, 0, 1),
        ListeningSocket("::", 21007, 0, 2),
        ListeningSocket("0.0.0.0", 21008, 0, 3),
        ListeningSocket("127.0.0.2", 21007, 1000, 4),
    ]

    holders = holders_of_port(21007, listening, engine_inodes={1}, holders={2: (77, 55)})

    assert holders.ours == (listening[0],)
    assert holders.foreign == ((listening[1], (55, 77)), (listening[3], ()))
