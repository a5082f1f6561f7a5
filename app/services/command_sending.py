"""Sending a pass's commands to the nodes: the reconciler's last step.

A command id already sent to a node is not sent again until that node says hello again
(agents execute an id once anyway; this keeps a pending start from being resent every
second). Ids name the replica they act on, and replica ids are never used again, so a node
connected for months would be sent ids without end: the newest ``REMEMBERED_PER_NODE`` are
kept, as many as the agent remembers of the commands it was sent. An older one planned
again goes again, and the agent, which has forgotten it too, carries it out as any other.

A node without a connection is skipped: the next pass sends it. A command that did not go
(``NodeNotConnected``, ``CommandNotSent``) counts as not sent: the live view stops awaiting
its answer and the next pass sends it again.

Each node's commands go in the order decided, one after another; the nodes' go side by
side. A send waits on its node's connection (up to the hub's send timeout for one that
reads nothing, ``app.hub.hub.SEND_TIMEOUT_S``), and only that node's later commands wait
with it: a slow or hostile node delays no command to another. A pass sends at most one
command at a time per node, so what is in flight is bounded by the pass's decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import structlog

from app.domain import commands as domain
from app.domain.commands import CommandNotSent, NodeNotConnected
from app.domain.decision import Command

log = structlog.get_logger(__name__)

REMEMBERED_PER_NODE = 1024
"""The ids sent to a node since its hello that are kept (``agent.session``'s
``REMEMBERED_COMMANDS``)."""


class CommandChannel(Protocol):
    """Where commands go: the agent hub. Raises ``NodeNotConnected`` for a node without a
    live connection and ``CommandNotSent`` for any other reason a command did not go."""

    async def send_command(
        self, node_id: str, command: domain.StartShard | domain.StopShard
    ) -> None: ...


class Greetings(Protocol):
    """What the sender reads and tells of the live view (``LiveView``)."""

    def greeting(self, node_id: str) -> int | None: ...

    def sending(self, node_id: str, command_id: str, at: datetime) -> None: ...

    def not_sent(self, node_id: str, command_id: str) -> None: ...


@dataclass
class _SentSinceHello:
    greeting: int
    command_ids: dict[str, None] = field(default_factory=dict)
    """Oldest first, at most ``REMEMBERED_PER_NODE``."""

    def add(self, command_id: str) -> None:
        self.command_ids[command_id] = None
        if len(self.command_ids) > REMEMBERED_PER_NODE:
            del self.command_ids[next(iter(self.command_ids))]


class CommandSender:
    def __init__(
        self, channel: CommandChannel, view: Greetings, clock: Callable[[], datetime]
    ) -> None:
        self._channel = channel
        self._view = view
        self._clock = clock
        self._sent: dict[str, _SentSinceHello] = {}

    async def send(self, commands: Sequence[Command]) -> int:
        """Send ``commands``, each node's in the order given, the nodes side by side; how
        many went. Returns once every node's have gone or failed; an error other than a
        command not sent stops the other nodes' sends and is raised."""
        by_node: dict[str, list[Command]] = {}
        for planned in commands:
            by_node.setdefault(planned.node_id, []).append(planned)
        try:
            async with asyncio.TaskGroup() as sending:
                counts = [sending.create_task(self._send_in_order(run)) for run in by_node.values()]
        except ExceptionGroup as failed:
            # Raised as itself: the reconcile loop stops leading on a ``FencedError`` (met
            # recording a node's disconnect), which it would not see inside a group.
            raise failed.exceptions[0] from failed
        for node_id in [n for n in self._sent if self._view.greeting(n) is None]:
            del self._sent[node_id]
        return sum(count.result() for count in counts)

    async def _send_in_order(self, commands: list[Command]) -> int:
        """One node's commands, one after another: each waits for the one before to go."""
        sent = 0
        for planned in commands:
            if await self._send_one(planned):
                sent += 1
        return sent

    async def _send_one(self, planned: Command) -> bool:
        node_id, command_id = planned.node_id, planned.command.command_id
        greeting = self._view.greeting(node_id)
        if greeting is None:
            return False
        ledger = self._sent.get(node_id)
        if ledger is None or ledger.greeting != greeting:
            ledger = self._sent[node_id] = _SentSinceHello(greeting)
        if command_id in ledger.command_ids:
            return False
        with structlog.contextvars.bound_contextvars(
            node_id=node_id, replica_id=planned.command.replica_id, command_id=command_id
        ):
            # Awaited from before the send until the agent answers: a stopping replica
            # whose start is awaited may be coming up (``replica_outcomes._shard_gone``).
            self._view.sending(node_id, command_id, self._clock())
            try:
                await self._channel.send_command(node_id, planned.command)
            except NodeNotConnected:
                self._view.not_sent(node_id, command_id)
                return False
            except CommandNotSent as exc:
                self._view.not_sent(node_id, command_id)
                log.warning("command_not_sent", error=str(exc))
                return False
        ledger.add(command_id)
        return True
