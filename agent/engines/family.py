"""The processes of one engine beyond its process group, and waiting until none is left.

An engine leads its own session and process group, and a signal to the group reaches every
worker that stayed in it. A worker that started a session (or a group) of its own is still
the engine's (``agent.engines.proc_net.engine_family``: it may hold the engine's port and
GPUs), but no group signal reaches it, and once the leader is gone it is re-parented. So a
stop finds such workers while the leader still runs, signals them as it signals the group,
and reports the engine stopped only once none of its processes runs.

Every engine is spawned with a launch token in its environment
(``wire.engine_env.LAUNCH_TOKEN_VARIABLE``, kept in its ``LaunchRecord`` and
``ShardRecord``), which its workers inherit. It is what
finds an engine's processes when nothing else can: workers left by a leader that died while
no agent watched (its pid and group id may be another program's by then), and an engine
spawned by an agent killed before it recorded it.

A process is named by its pid and its start time (``agent.engines.records``): a pid alone
could be reused by another program between the moment it is found and the signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from agent.engines.identity import has_launch_token
from agent.engines.proc_listing import PROC, process_ids
from agent.engines.proc_net import ProcessFamily, engine_family, parse_family
from agent.engines.processes import signal_group
from agent.engines.records import ProcStat, ShardRecord, is_running, parse_proc_stat

GONE_POLL_S = 0.05


class Launched(NamedTuple):
    pid: int
    start_time: int


def end_launched(token: str, proc: Path = PROC) -> Launched | None:
    """SIGKILL every running process whose environment sets ``LAUNCH_TOKEN_VARIABLE`` to
    ``token`` (an engine spawned with it and the workers that inherited it), and the
    process group of each that leads one. The engine's leader, if it was found."""
    found: dict[int, tuple[ProcessFamily, ProcStat]] = {}
    for pid, entry in _running(proc):
        if has_launch_token(pid, token, proc):
            found[pid] = entry
    leader: Launched | None = None
    for pid, (family, stat) in found.items():
        if family.pgrp == pid:
            signal_group(pid, signal.SIGKILL)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if family.session == pid and family.ppid not in found:
            leader = Launched(pid, stat.start_time)
    return leader


def outside_group(leader: int, proc: Path = PROC) -> dict[int, int]:
    """The running processes of the engine led by ``leader`` that are not in its process
    group (workers in sessions or groups of their own), by pid, with their start time."""
    running = dict(_running(proc))
    family = engine_family(leader, (family for family, _ in running.values()))
    return {
        pid: running[pid][1].start_time
        for pid in family
        if pid in running and running[pid][0].pgrp != leader
    }


def signal_each(processes: Mapping[int, int], signum: int) -> None:
    """Send ``signum`` to each process (pid -> start time) that is still that process."""
    for pid, start_time in processes.items():
        if is_running(pid, start_time):
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                continue


def ask_each_to_stop(processes: Mapping[int, int], stop_signal: int) -> None:
    """Send each process (pid -> start time) that is still that process ``stop_signal``, then
    SIGCONT, so that a stopped one acts on it now (``agent.engines.processes.ask_to_stop``)."""
    signal_each(processes, stop_signal)
    signal_each(processes, signal.SIGCONT)


def still_running(leader: int, outside: Mapping[int, int], proc: Path = PROC) -> list[int]:
    """The pids of the engine's processes that still run: any in the group or session
    ``leader`` led (its id cannot be reused while one of them is left), and any of
    ``outside`` that is still the same process."""
    left = [pid for pid, (family, _) in _running(proc) if leader in (family.pgrp, family.session)]
    left.extend(pid for pid, start_time in outside.items() if is_running(pid, start_time))
    return sorted(set(left))


async def wait_until_gone(leader: int, outside: Mapping[int, int], within_s: float) -> list[int]:
    """Poll until no process of the engine runs or ``within_s`` passed; the pids left."""
    deadline = time.monotonic() + within_s
    while True:
        left = await asyncio.to_thread(still_running, leader, outside)
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(GONE_POLL_S)  # not our children: nothing to wait on but /proc


def end_remains(record: ShardRecord) -> None:
    """SIGKILL what is left of a recorded engine whose leader is gone (workers that did not
    notice, and hold its port and GPUs), found by the launch token in their environment:
    the leader's pid, and so its group id, may belong to another program by now. A record
    written before launch tokens existed names none, and nothing is done."""
    if record.launch_token:
        end_launched(record.launch_token)


def _running(proc: Path) -> Iterator[tuple[int, tuple[ProcessFamily, ProcStat]]]:
    """Every process that has not exited (zombies left out), with where it stands."""
    for pid in process_ids(proc):
        try:
            text = (proc / str(pid) / "stat").read_text()
            family, stat = parse_family(text), parse_proc_stat(text)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not readable
        if not stat.exited:
            yield family.pid, (family, stat)
