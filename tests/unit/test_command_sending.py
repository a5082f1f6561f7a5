"""A pass's commands, sent: each node's in the order decided, no node waiting on another,
and what did not go counted as not sent."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from app.domain.commands import NodeNotConnected, StartShard, StopShard
from app.domain.decision import Command
from app.services.command_sending import REMEMBERED_PER_NODE, CommandSender
from app.store.errors import FencedError
from tests.support.waiting import wait_until

AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Channel:
    """A channel (the hub's interface) whose sends to ``held`` wait for ``release``."""

    def __init__(self, held: str = "", gone: str = "") -> None:
        self.held, self.gone = held, gone
        self.release = asyncio.Event()
        self.sent: list[tuple[str, str]] = []

    async def send_command(self, node_id: str, command: StartShard | StopShard) -> None:
        if node_id == self.gone:
            raise NodeNotConnected(node_id)
        if node_id == self.held:
            await self.release.wait()
        self.sent.append((node_id, command.command_id))


class View:
    """The live view's side the sender sees: every node greeted once."""

    def __init__(self) -> None:
        self.awaited: set[tuple[str, str]] = set()

    def greeting(self, node_id: str) -> int | None:
        return 1

    def sending(self, node_id: str, command_id: str, at: datetime) -> None:
        self.awaited.add((node_id, command_id))

    def not_sent(self, node_id: str, command_id: str) -> None:
        self.awaited.discard((node_id, command_id))


def stop(node_id: str, number: int) -> Command:
    command = StopShard(
        command_id=f"stop-{number}", replica_id=f"r-{number}", shard_index=0, grace_s=30.0
    )
    return Command(node_id=node_id, command=command)


async def test_each_nodes_commands_keep_their_order_while_another_node_waits() -> None:
    channel, view = Channel(held="slow"), View()
    sender = CommandSender(channel, view, lambda: AT)
    decided = [stop("slow", 1), stop("fast", 2), stop("slow", 3), stop("fast", 4)]

    sending = asyncio.create_task(sender.send(decided))
    await wait_until(lambda: len(channel.sent) == 2, what="the fast node's commands sent")
    assert channel.sent == [("fast", "stop-2"), ("fast", "stop-4")]
    channel.release.set()

    assert await sending == 4
    assert channel.sent[2:] == [("slow", "stop-1"), ("slow", "stop-3")]


async def test_a_command_that_did_not_go_is_not_awaited_and_not_counted() -> None:
    channel, view = Channel(gone="away"), View()
    sender = CommandSender(channel, view, lambda: AT)

    assert await sender.send([stop("away", 1), stop("here", 2)]) == 1
    assert view.awaited == {("here", "stop-2")}
    assert await sender.send([stop("away", 1), stop("here", 2)]) == 0, "stop-2 sent again"
    assert channel.sent == [("here", "stop-2")]


class Deposing(Channel):
    """A channel whose send to ``fenced`` meets a newer leader (recording the node's
    disconnect, say)."""

    async def send_command(self, node_id: str, command: StartShard | StopShard) -> None:
        if node_id == "fenced":
            raise FencedError(1, 2)
        await super().send_command(node_id, command)


async def test_a_newer_leader_met_while_sending_is_raised_as_such() -> None:
    """The reconcile loop stops leading on ``FencedError``; one wrapped in an exception
    group would be logged as a failed pass and the deposed leader would go on."""
    sender = CommandSender(Deposing(), View(), lambda: AT)

    with pytest.raises(FencedError):
        await sender.send([stop("here", 1), stop("fenced", 2)])


async def test_a_node_connected_for_months_keeps_the_newest_ids_it_was_sent_and_no_more() -> None:
    """Ids name the replica they act on, and replica ids are never used again: the sender
    keeps the newest ``REMEMBERED_PER_NODE`` sent since the node's hello, and sends an
    older one planned again (the agent, remembering as many, has forgotten it too)."""
    channel, view = Channel(), View()
    sender = CommandSender(channel, view, clock=lambda: AT)
    for number in range(REMEMBERED_PER_NODE + 1):
        assert await sender.send([stop("gpu-1", number)]) == 1

    assert await sender.send([stop("gpu-1", REMEMBERED_PER_NODE)]) == 0
    assert await sender.send([stop("gpu-1", 1)]) == 0
    assert await sender.send([stop("gpu-1", 0)]) == 1, "the oldest was forgotten"
