"""The services on the in-memory store, with fakes of their other ports: no database, no
socket. The same stories run against PostgreSQL and real agents in tests/integration."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import pytest
from msgspec.structs import replace

from app.domain import commands
from app.domain.events import GpuInfo
from app.domain.model_spec import ModelSpec
from app.domain.reconcile import Settings
from app.domain.reports import AgentConnected, AgentInventory, CommandAnswered, ReportedShard
from app.services.agent_reports import LiveView, ReportRecorder
from app.services.operations import Caller, Operations
from app.services.reconciler import Reconciler
from app.store.errors import FencedError
from app.store.memory import InMemoryEventStore
from tests.support.waiting import wait_until

ALICE = Caller(actor="alice", request_id="req-1")
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class Agents:
    """A command channel that remembers what it was asked to send, and to whom."""

    def __init__(self, connected: set[str]) -> None:
        self.connected = connected
        self.sent: list[tuple[str, str]] = []

    async def send_command(
        self, node_id: str, command: commands.StartShard | commands.StopShard
    ) -> None:
        if node_id not in self.connected:
            raise commands.NodeNotConnected(node_id)
        self.sent.append((node_id, command.command_id))


def hello(node_id: str) -> AgentConnected:
    gpus = tuple(
        GpuInfo(index=i, uuid=f"{node_id}-{i}", name="H100", memory_total_mib=81559)
        for i in range(2)
    )
    inventory = AgentInventory(
        node_id=node_id,
        address="127.0.0.1",
        remote_address="127.0.0.1:40000",
        labels={},
        gpus=gpus,
        port_range=(20000, 20999),
        agent_version="t",
    )
    return AgentConnected(inventory=inventory)


async def test_an_operator_declares_scales_and_drains_and_every_step_is_recorded_as_theirs() -> (
    None
):
    store = InMemoryEventStore()
    operations = Operations(store, clock=lambda: T0)
    await ReportRecorder(store).handle(hello("gpu-1"))

    assert await operations.apply_model(ALICE, ModelSpec(name="llama", command="sim --port {port}"))
    assert await operations.scale(ALICE, "llama", 3)
    drain_id = (await operations.drain_node(ALICE, "gpu-1", 600)).drain_id

    [status] = await operations.models()
    assert status.model.desired == 3
    progress = await operations.drain(drain_id)
    assert (progress.node_id, progress.requested_by, progress.finished) == ("gpu-1", "alice", False)
    recorded = await store.read_all()
    operator_made = [r for r in recorded if not r.meta.actor.startswith("agent:")]
    assert {r.meta.actor for r in operator_made} == {"alice"}
    assert {r.meta.causation_id for r in operator_made} == {"req-1"}


async def test_the_reconciler_adds_up_how_long_its_passes_took_for_the_duration_summary() -> None:
    store = InMemoryEventStore()
    view = LiveView(ReportRecorder(store))
    settings = Settings(epoch=1, started_at=T0 - timedelta(hours=1))
    reconciler = Reconciler(store, Agents(connected=set()), view, settings, clock=lambda: T0)

    first = await reconciler.run_pass()
    second = await reconciler.run_pass()

    assert reconciler.pass_count == 2
    assert reconciler.pass_seconds_total == first.duration_s + second.duration_s > 0


async def test_a_reconcile_pass_places_a_declared_model_and_sends_the_start_to_its_node() -> None:
    store = InMemoryEventStore()
    view = LiveView(ReportRecorder(store))
    agents = Agents(connected={"gpu-1"})
    await view.handle(hello("gpu-1"))
    await Operations(store).apply_model(ALICE, ModelSpec(name="llama", command="sim --port {port}"))
    settings = Settings(epoch=1, started_at=T0 - timedelta(hours=1))
    reconciler = Reconciler(store, agents, view, settings, clock=lambda: T0)

    report = await reconciler.run_pass()

    assert (report.outcome, report.events, report.sent) == ("done", 1, 1)
    assert agents.sent == [("gpu-1", "start-llama-1-0")]
    assert store.state.replicas["llama-1"].shards[0].node_id == "gpu-1"
    # Awaited until the agent answers: till then its engine may be coming up unreported.
    assert view.snapshot().reports["gpu-1"].awaited == {"start-llama-1-0": T0}
    again = await reconciler.run_pass()
    assert (again.events, again.sent) == (0, 0)  # nothing new, and no command twice
    await view.handle(CommandAnswered(node_id="gpu-1", command_id="start-llama-1-0", ok=True))
    assert view.snapshot().reports["gpu-1"].awaited == {}


async def test_a_command_for_a_node_that_went_away_waits_for_its_next_hello() -> None:
    store = InMemoryEventStore()
    view = LiveView(ReportRecorder(store))
    agents = Agents(connected=set())  # its connection is gone, the view not told yet
    await view.handle(hello("gpu-1"))
    await Operations(store).apply_model(ALICE, ModelSpec(name="llama", command="sim --port {port}"))
    settings = Settings(epoch=1, started_at=T0 - timedelta(hours=1))
    reconciler = Reconciler(store, agents, view, settings, clock=lambda: T0)

    report = await reconciler.run_pass()

    assert (report.events, report.commands, report.sent) == (1, 1, 0)
    assert view.snapshot().reports["gpu-1"].awaited == {}  # no answer will come
    agents.connected.add("gpu-1")
    await view.handle(hello("gpu-1"))  # it says hello again: the command is due again
    assert (await reconciler.run_pass()).sent == 1


async def test_a_deposed_leader_sends_nothing_its_successor_appended() -> None:
    # A leader paused past its lease resumes: its pass catches up with what the new leader
    # appended (a replica placed on a node still connected to the old one) and would send
    # the start with no append of its own to be fenced.
    store = InMemoryEventStore()
    await Operations(store).apply_model(ALICE, ModelSpec(name="llama", command="sim --port {port}"))
    old_view, new_view = LiveView(ReportRecorder(store)), LiveView(ReportRecorder(store))
    await old_view.handle(hello("gpu-1"))
    await new_view.handle(hello("gpu-1"))
    old_agents, new_agents = Agents(connected={"gpu-1"}), Agents(connected={"gpu-1"})
    long_ago = T0 - timedelta(hours=1)
    old = Reconciler(
        store, old_agents, old_view, Settings(epoch=1, started_at=long_ago), clock=lambda: T0
    )
    new = Reconciler(
        store, new_agents, new_view, Settings(epoch=2, started_at=long_ago), clock=lambda: T0
    )
    assert (await new.run_pass()).sent == 1

    with pytest.raises(FencedError):
        await old.run_pass()

    assert old_agents.sent == []


async def test_a_wake_that_arrives_during_a_pass_starts_the_next_pass_as_soon_as_it_ends() -> None:
    # An append made while a pass runs was not in what it read: the wake it sends must not
    # be lost with the pass, or the change waits for the interval (an hour here).
    store = InMemoryEventStore()
    view = LiveView(ReportRecorder(store))
    settings = Settings(epoch=1, started_at=T0 - timedelta(hours=1))

    def clock() -> datetime:
        # Read by every pass as it starts: the first one is woken while it runs.
        if reconciler.pass_count == 0:
            reconciler.wake()
        return T0

    reconciler = Reconciler(
        store, Agents(connected=set()), view, settings, interval_s=3600, clock=clock
    )
    running = asyncio.get_running_loop().create_task(reconciler.run())
    try:
        await wait_until(
            lambda: reconciler.pass_count >= 2, what="a second pass, started by the wake"
        )
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_explain_placement_holds_the_port_of_an_engine_a_connected_node_reports_running() -> (
    None
):
    """The leader's live view reaches the explanation: an engine the log knows nothing of,
    still running on gpu-1's first port, keeps it from the next replica, as the reconciler
    keeps it (``Allocations.for_placement``)."""
    store = InMemoryEventStore()
    view = LiveView(ReportRecorder(store))
    stray = ReportedShard(
        replica_id="other-7", shard_index=0, model="other", port=20000, pid=99, state="ready"
    )
    await view.handle(replace(hello("gpu-1"), shards=(stray,)))
    operations = Operations(store, running=lambda: view.snapshot().reports)
    spec = ModelSpec(name="llama", command="sim --port {port}")
    await operations.apply_model(ALICE, spec)

    explained = await operations.placement("llama")
    dry_run = await operations.placement_dry_run(spec)
    by_the_log = await Operations(store).placement("llama")

    assert [s.port for s in explained.placement or ()] == [20001]
    assert [s.port for s in dry_run.placement or ()] == [20001]
    assert [s.port for s in by_the_log.placement or ()] == [20000]
