"""The shards the supervisor knows of: those it watches run, and those that failed.

Kept apart from watching and stopping because it is what the agent reports (every
``hello`` and heartbeat lists it) and its bound is a rule of its own (``FAILED_KEPT``). A
shard that failed stays listed as ``failed`` until it is stopped or started again (or
newer failures push it out), so a failure that happened while the control plane could not
hear it still reaches it with the next ``hello``.
"""

from __future__ import annotations

from agent.engines.records import ShardKey, ShardRecord
from agent.engines.watched import Watched

FAILED_KEPT = 256
"""How many failed shards the agent keeps reporting, the newest. The control plane stops
only shards that run, so a failed one is otherwise kept until the agent exits: a model that
crashes again and again (a new replica each time) would grow every heartbeat and hello
without end, and past the 4,096 shards a message may list, the control plane would refuse
them all and the node could never connect again. A node runs far fewer shards at once, so
a failure it could not report while disconnected still reaches the next hello."""


class ShardInventory:
    def __init__(self, failed_kept: int = FAILED_KEPT) -> None:
        self.running: dict[ShardKey, Watched] = {}
        """The engines watched, starting or ready."""
        self._failed: dict[ShardKey, ShardRecord] = {}
        """Failed shards, oldest first, at most ``failed_kept`` (``FAILED_KEPT``)."""
        self._failures: dict[ShardKey, str] = {}
        """Why each shard in ``_failed`` failed, as its ``failed`` change said."""
        self._failed_kept = failed_kept

    def remember_failed(self, record: ShardRecord, error: str) -> None:
        """Keep ``record`` in the inventory, with why it failed (``error``), until its shard
        is stopped or started again, or ``failed_kept`` newer failures push it out."""
        self.forget_failed(record.key)
        self._failed[record.key] = record
        self._failures[record.key] = error
        while len(self._failed) > self._failed_kept:
            self.forget_failed(next(iter(self._failed)))

    def forget_failed(self, key: ShardKey) -> None:
        self._failed.pop(key, None)
        self._failures.pop(key, None)

    def failed(self, key: ShardKey) -> ShardRecord | None:
        """The shard's record while it is listed ``failed``."""
        return self._failed.get(key)

    def failure(self, key: ShardKey) -> str | None:
        """Why the shard failed, while the inventory lists it ``failed``."""
        return self._failures.get(key)

    def known(self) -> set[ShardKey]:
        """The shards running or listed ``failed``."""
        return {*self.running, *self._failed}

    def records(self) -> list[ShardRecord]:
        """Every shard listed, in its current state, in key order."""
        records = [watched.record for watched in self.running.values()]
        records.extend(self._failed.values())
        return sorted(records, key=lambda record: record.key)
