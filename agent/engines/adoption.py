"""Adoption at start: taking over the engines an earlier agent process left running.

Engines outlive the agent on purpose, so an agent that starts again watches each recorded
engine that is still alive (never restarting it) and tells of the others: a record whose
process is not its engine any more (``agent.engines.identity``) is reported ``failed``
and what is left of its engine killed, and an engine spawned by an agent killed before it
recorded it is killed (``agent.engines.family``). Apart from the supervisor because it
runs once, before any start, and decides from records rather than from processes the
agent spawned.
"""

from __future__ import annotations

import asyncio

import msgspec
import structlog

from agent.engines.changes import LOG_TAIL_LINES, REASON_TAIL_LINES, change_of
from agent.engines.family import end_launched, end_remains
from agent.engines.identity import identity_refusal
from agent.engines.inventory import ShardInventory
from agent.engines.logfiles import restrict_logs
from agent.engines.processes import AdoptedProcess
from agent.engines.records import LaunchRecord, RecordStore, ShardRecord, ShardState
from agent.engines.reporting import ShardReporter
from agent.engines.watching import EngineWatcher
from wire.engines import failure_reason, profile_of

log = structlog.get_logger(__name__)

UNRECORDED_ERROR = (
    "the agent was killed while it started the engine, before it recorded it: the engine was killed"
)


class EngineAdoption:
    def __init__(
        self,
        inventory: ShardInventory,
        records: RecordStore,
        reporter: ShardReporter,
        watcher: EngineWatcher,
        *,
        poll_interval_s: float,
    ) -> None:
        self._inventory = inventory
        self._records = records
        self._reporter = reporter
        self._watcher = watcher
        self._poll_interval_s = poll_interval_s

    async def adopt_recorded(self) -> list[ShardRecord]:
        """Watch every recorded engine that is still alive, report the others ``failed``
        (see the module docstring); the records of the engines adopted."""
        adopted: list[ShardRecord] = []
        for leftover in self._records.remove_temporaries():
            log.info("shard_record_temporary_removed", path=str(leftover))
        records = self._records.load_all()
        recorded = {record.key for record in records}
        for launch in self._records.load_launches():
            if launch.key not in recorded:
                await self._end_unrecorded(launch)
            self._records.remove_launch(launch.key)
        for record in records:
            if record.key in self._inventory.running:
                continue
            refusal = identity_refusal(record)
            if refusal is None:
                adopted.append(self._adopt(record))
                continue
            end_remains(record)
            self._records.remove(record.key)
            failed = msgspec.structs.replace(record, state=ShardState.FAILED)
            searched = self._reporter.tail(record.key, REASON_TAIL_LINES)
            tail = searched[-LOG_TAIL_LINES:]
            error = _with_log_reason(refusal, record, searched)
            self._inventory.remember_failed(failed, error)
            self._reporter.report(change_of(failed, error=error, log_tail=tail))
        return adopted

    def _adopt(self, record: ShardRecord) -> ShardRecord:
        """Watch the recorded engine, alive, as ``starting``: it was not watched, so it is
        starting again until it answers its health checks."""
        unconfirmed = msgspec.structs.replace(record, state=ShardState.STARTING)
        self._reporter.save_state(unconfirmed)
        for restricted in restrict_logs(self._reporter.log_path(record.key)):
            log.info("engine_log_restricted", path=str(restricted))
        process = AdoptedProcess(unconfirmed, poll_interval_s=self._poll_interval_s)
        return self._watcher.watch(unconfirmed, process).record

    async def _end_unrecorded(self, launch: LaunchRecord) -> None:
        """Kill the engine an agent killed mid-start spawned but never recorded (nobody
        was told it runs, and nothing would ever stop it); report it ``failed`` if it ran."""
        leader = await asyncio.to_thread(end_launched, launch.token)
        if leader is None:
            return
        log.warning("unrecorded_engine_killed", replica_id=launch.replica_id, pid=leader.pid)
        failed = launch.spawned(leader.pid, leader.start_time, ShardState.FAILED)
        self._inventory.remember_failed(failed, UNRECORDED_ERROR)
        tail = self._reporter.tail(launch.key)
        self._reporter.report(change_of(failed, error=UNRECORDED_ERROR, log_tail=tail))


def _with_log_reason(why: str, record: ShardRecord, log_tail: tuple[str, ...]) -> str:
    """``why``, followed by the reason the engine's log gives, if a line of it matches one
    of its profile's failure patterns (``wire.engines.failure_reason``)."""
    reason = failure_reason(profile_of(record.engine), log_tail)
    return why if reason is None else f"{why}: {reason}"
