"""Whether the process a shard record names is that record's engine, and why not.

A record names its engine by pid and start time (``agent.engines.records``), and a
restarted agent adopts (or ``stop-engines`` signals) only a process that matches both. A
start time counts from boot, though: after a reboot a record kept in the state directory
can name a program that happens to have the same pid and start time. So the process must
also hold the record's launch token in its environment (``LAUNCH_TOKEN_VARIABLE``), which
every engine is spawned with.

An engine whose command clears its environment (``env -i ...``) holds no token, and was
left running (its port and GPUs held) while its shard was reported failed. Such a process
is taken for the engine when its environment, readable, holds no launch token at all (one
that holds another token is another launch's), it still leads the session and process
group the agent spawned it in (an engine is spawned as a session leader, and its pid is
its group's id), and the kernel's boot id is the one the record was written in: after a
reboot, a program with the same pid and start time would fail that last check. A record
written before boot ids were recorded gets no such allowance.
"""

from __future__ import annotations

from pathlib import Path

from agent.engines.proc_listing import PROC
from agent.engines.proc_net import parse_family
from agent.engines.records import ShardRecord, current_boot_id, parse_proc_stat
from wire.engine_env import LAUNCH_TOKEN_VARIABLE

AWAY_ERROR = "engine exited while the agent was away"


def launch_token_of(pid: int, proc: Path = PROC) -> str | None:
    """The launch token process ``pid`` was started with (``/proc/<pid>/environ``: the
    environment of its current program), "" if its environment holds none. None if it is
    gone or its environment is not ours to read (another user's process is not our
    engine)."""
    try:
        environ = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = f"{LAUNCH_TOKEN_VARIABLE}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("utf-8", "replace")
    return ""


def has_launch_token(pid: int, token: str, proc: Path = PROC) -> bool:
    """Whether process ``pid`` was started with ``LAUNCH_TOKEN_VARIABLE`` set to ``token``."""
    return launch_token_of(pid, proc) == token


def identity_refusal(record: ShardRecord) -> str | None:
    """Why the process ``record`` names is not its engine, as one line; None if it is (see
    the module docstring)."""
    try:
        text = (PROC / str(record.pid) / "stat").read_text()
    except OSError:
        return f"{AWAY_ERROR} (pid {record.pid} is gone)"
    stat = parse_proc_stat(text)
    if stat.exited:
        return f"{AWAY_ERROR} (pid {record.pid} is gone)"
    if stat.start_time != record.process_start_time:
        return f"{AWAY_ERROR} (pid {record.pid} is another process now)"
    if not record.launch_token:
        return None  # written before launch tokens existed: pid and start time alone
    token = launch_token_of(record.pid)
    if token == record.launch_token:
        return None
    unlike = f"pid {record.pid} runs with the engine's start time but is not taken for it"
    if token is None:
        return f"{unlike}: its environment cannot be read"
    if token:
        return f"{unlike}: it holds another launch's token"
    if not record.boot_id:
        return (
            f"{unlike}: it holds no launch token, and the record, written by an older agent, "
            "names no boot to tell it by"
        )
    if record.boot_id != current_boot_id():
        return f"{unlike}: it holds no launch token, and the machine has rebooted since"
    family = parse_family(text)
    if not record.pid == family.pgrp == family.session:
        return f"{unlike}: it holds no launch token, and no longer leads its own process group"
    return None


def is_recorded_engine(record: ShardRecord) -> bool:
    """True only if the process ``record`` names is its engine, alive: what a restarted
    agent checks before it adopts, or signals, a process a record names."""
    return identity_refusal(record) is None
