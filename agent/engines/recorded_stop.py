"""Stopping the engines a state directory records, with no agent running:
``llmgw-agent stop-engines``.

Each recorded engine that is still the same process (pid and start time, with the record's
launch token in its environment, or for an engine whose command cleared it the same boot and
process group: ``agent.engines.identity.is_recorded_engine``, checked again right before
each signal) gets SIGTERM to its process group, and SIGCONT so that a stopped
engine acts on it at once (``agent.engines.processes.ask_to_stop``), then SIGKILL once
``grace_s`` has passed; its record is removed once it is gone. A process that is no longer
the engine by the time of a signal (the engine exited, or replaced itself with another
program) is not signalled, and the engine is reported ``gone``. Records of engines that
exited already are removed too. Whatever is left of each engine once its leader is gone
(workers that ignored SIGTERM, or outlived a leader that died on its own:
``agent.engines.family.end_remains``) is killed, and so is an engine an agent killed
mid-start spawned but never recorded (``agent.engines.family.end_launched``). Engines are
not children of this process, so their end is seen in ``/proc`` rather than waited for.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import NamedTuple

from agent.engines.family import end_launched, end_remains
from agent.engines.identity import is_recorded_engine
from agent.engines.processes import KILL_WAIT_S, ask_group_to_stop, signal_group
from agent.engines.records import RecordStore, ShardRecord, is_same_process

POLL_S = 0.05


class RecordedStop(NamedTuple):
    record: ShardRecord
    outcome: str
    """``stopped`` (it exited after SIGTERM), ``killed`` (after SIGKILL), ``gone`` (it had
    exited already) or ``survived`` (still there after SIGKILL: its record is kept)."""


def stop_recorded_engines(state_dir: Path, grace_s: float) -> list[RecordedStop]:
    """Stop every engine recorded in ``state_dir`` (see the module docstring)."""
    store = RecordStore(state_dir)
    records = store.load_all()
    recorded = {record.key for record in records}
    for launch in store.load_launches():
        if launch.key not in recorded:
            end_launched(launch.token)  # spawned by an agent killed before it recorded it
        store.remove_launch(launch.key)
    alive = [record for record in records if is_recorded_engine(record)]
    outcomes = {record.key: "gone" for record in records}
    if grace_s > 0:
        alive = _signal_all(alive, signal.SIGTERM)
        left = _wait_for_exit(alive, grace_s)
        outcomes |= {record.key: "stopped" for record in alive}
        alive = left
    signalled = _signal_all(alive, signal.SIGKILL)
    for record in alive:
        if record not in signalled:
            outcomes[record.key] = "gone"
    alive = signalled
    survivors = _wait_for_exit(alive, KILL_WAIT_S)
    for record in alive:
        outcomes[record.key] = "killed"
    for record in survivors:
        outcomes[record.key] = "survived"
    for record in records:
        if outcomes[record.key] != "survived":
            end_remains(record)
            store.remove(record.key)
    return [RecordedStop(record, outcomes[record.key]) for record in records]


def _signal_all(records: list[ShardRecord], signum: signal.Signals) -> list[ShardRecord]:
    """Send ``signum`` to the process group of each record's engine that is still that
    engine (SIGCONT after a SIGTERM: ``ask_group_to_stop``); the records signalled. Each is
    checked right before its signal, as a restarted agent checks: the engine may have ended
    since it was last seen, and its pid gone to another program, or it may have replaced
    itself (``exec``) by one that is not the engine, with the same pid and start time."""
    signalled: list[ShardRecord] = []
    for record in records:
        if not is_recorded_engine(record):
            continue
        if signum == signal.SIGTERM:
            sent = ask_group_to_stop(record.pid, signum)
        else:
            sent = signal_group(record.pid, signum)
        if sent:
            signalled.append(record)
    return signalled


def _wait_for_exit(records: list[ShardRecord], within_s: float) -> list[ShardRecord]:
    """The records whose engine still runs after ``within_s``."""
    deadline = time.monotonic() + within_s
    alive = [record for record in records if is_same_process(record)]
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)  # not our children: nothing to wait on but /proc
        alive = [record for record in alive if is_same_process(record)]
    return alive
