"""An operator's undo that reaches the log between a reconciler pass's catch-up and its
append, on the in-memory store with two control planes over one log: the leader
reconciles, and the undo is recorded through the other."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from app.domain.envelope import Meta, Recorded
from app.domain.events import AnyEvent, RolloutFinished
from app.domain.evolve import evolve
from app.domain.reconcile import Settings
from app.domain.state import ClusterState, ReplicaPhase, RolloutState
from app.services.agent_reports import LiveView, ReportRecorder
from app.services.operations import Caller, Operations
from app.services.reconciler import Reconciler
from app.store.folded import FoldedEventStore
from app.store.interface import AppendRequest, NewEvent
from app.store.memory import InMemoryEventStore
from tests.unit.test_reconcile import Cluster, of_type
from tests.unit.test_rollout_verdict_pass import Gateways, hello
from tests.unit.test_rollouts import revise, serving
from tests.unit.test_services_in_memory import Agents

ALICE = Caller(actor="alice", request_id="req-1")


def about_to_finish(cluster: Cluster) -> None:
    """Rounds of the rollout (a pass, the agents doing what it asked) until the next pass
    would record that it succeeded."""
    for _ in range(40):
        decision = cluster.decided()
        if of_type(decision, RolloutFinished):
            return
        cluster.appended(decision)
        for replica in list(cluster.state.replicas.values()):
            if replica.phase is ReplicaPhase.PLACED:
                cluster.serve(replica.id)
            elif replica.phase is ReplicaPhase.STOPPING:
                cluster.stop_reported(replica.id)
        cluster.after(11)
    raise AssertionError("the rollout did not come to its end")


async def test_an_undo_recorded_while_a_pass_decides_the_rollout_succeeded_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a rollout whose every replica runs its revision, one pass from its end ...
    written: list[tuple[str, AnyEvent, datetime]] = []

    def evolve_and_keep(state: ClusterState, recorded: Recorded) -> None:
        written.append((recorded.stream, recorded.event, recorded.recorded_at))
        evolve(state, recorded)

    monkeypatch.setattr("tests.unit.test_reconcile.evolve", evolve_and_keep)
    cluster = serving()
    revise(cluster)
    about_to_finish(cluster)
    now = cluster.now
    monkeypatch.undo()
    # ... on a log that two control planes read: the leader, and the one the operator uses.
    at = [now]
    leader_store = InMemoryEventStore(clock=lambda: at[0])
    for stream, event, recorded_at in written:
        at[0] = recorded_at
        await leader_store.append_many(
            [AppendRequest(stream, None, [NewEvent(event)])], Meta(actor="test", epoch=1)
        )
    at[0] = now
    other_store = FoldedEventStore(leader_store.recorder, clock=lambda: now)
    view = LiveView(ReportRecorder(leader_store))
    for report in cluster.reports.values():
        await view.handle(hello(report))
    settings = Settings(epoch=1, started_at=now - timedelta(hours=1), adoption_grace_ended=True)
    leader = Reconciler(
        leader_store,
        Agents(connected={"gpu-1", "gpu-2"}),
        view,
        settings,
        clock=lambda: now,
        in_flight=Gateways(),
    )

    # When the operator's undo is recorded just after the leader's pass has caught up ...
    caught_up = leader_store.catch_up
    undone: list[bool] = []

    async def catch_up_then_undo() -> ClusterState:
        state = await caught_up()
        if not undone:
            undone.append(
                await Operations(other_store, clock=lambda: now).undo_rollout(
                    ALICE, "llama", "rollout-llama-r2"
                )
            )
        return state

    monkeypatch.setattr(leader_store, "catch_up", catch_up_then_undo)
    await leader.run_pass()
    assert undone == [True]
    monkeypatch.undo()

    # ... then the pass, decided before the undo, records nothing: the rollout is rolling
    # back, not said to have succeeded at the old revision with every replica on the new.
    model = leader_store.state.models["llama"]
    assert model.rollout is not None
    assert (model.revision, model.rollout.state) == (1, RolloutState.ROLLING_BACK)
    assert leader.passes[-1].outcome == "conflict"
    # The next pass decides on the log with the undo in it, and brings the model back.
    await leader.run_pass()
    model = leader_store.state.models["llama"]
    assert model.rollout is not None
    assert model.rollout.state is RolloutState.ROLLING_BACK
    moved = [m.replica_id for m in model.moves.values() if m.move_id == "rollout-llama-r2"]
    assert moved, "the rollback moves no replica of revision 2"
    assert {leader_store.state.replicas[i].revision for i in moved} == {2}
