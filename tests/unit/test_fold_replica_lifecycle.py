"""A replica only moves on, whatever the log says next: every short sequence of the events
that move a replica, folded after its placement, is checked step by step. Once it ended it
stays ended as it first ended, and its shards take only the end of their engines, once;
once it is stopping it is never draining or routed again; a finished rollout stays
finished, and one rolling back takes only its finish."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from msgspec.structs import replace

from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    GpuMarkedUnhealthy,
    ModelDeclared,
    NodeConnected,
    ReplacementServing,
    ReplicaAdopted,
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    ReplicaFailed,
    ReplicaLost,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    ReplicaStopping,
    RolloutFinished,
    RolloutHolding,
    RolloutPaused,
    RolloutResumed,
    RolloutRolledBack,
    RolloutStarted,
    RolloutStepStarted,
    RolloutVerdict,
    ShardFailed,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    ShardStopped,
    replica_stream,
)
from app.domain.evolve import evolve, replay
from app.domain.model_spec import ModelSpec
from app.domain.state import (
    ACTIVE_PHASES,
    ENDED_PHASES,
    ClusterState,
    Replica,
    ReplicaPhase,
    RolloutState,
    ShardPhase,
)
from tests.support.generators import stream_for
from tests.unit.test_reconcile import gpus, of_type, with_two_nodes_and_a_model

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
SPEC = ModelSpec(name="llama", command="sim --port {port}", replicas=1)
REPLICA = "llama-1"
DEPTH = 4


def placement(number: int = 1) -> ReplicaPlaced:
    return ReplicaPlaced(
        replica_id=f"llama-{number}",
        model="llama",
        number=number,
        shards=(ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=20000 + number),),
    )


MOVES: tuple[AnyEvent, ...] = (
    placement(),
    ShardStarting(replica_id=REPLICA, shard_index=0, node_id="gpu-1", pid=7),
    ShardReady(replica_id=REPLICA, shard_index=0, node_id="gpu-1"),
    ShardFailed(replica_id=REPLICA, shard_index=0, node_id="gpu-1", error="exited"),
    ShardStopped(replica_id=REPLICA, shard_index=0, node_id="gpu-1"),
    ShardStopped(replica_id=REPLICA, shard_index=0, node_id="gpu-1", reason="agent shutting down"),
    ReplicaAdopted(replica_id=REPLICA, shard_index=0, node_id="gpu-1", port=20001, rule="test"),
    ReplicaServing(replica_id=REPLICA),
    ReplicaDrainStarted(replica_id=REPLICA, drain_id="drain-1"),
    ReplicaDrainCancelled(replica_id=REPLICA, drain_id="drain-1", reason="called off"),
    ReplacementServing(replica_id=REPLICA, replacement_id="llama-2"),
    ReplicaStopping(replica_id=REPLICA, reason="surplus"),
    ReplicaStopped(replica_id=REPLICA),
    ReplicaFailed(replica_id=REPLICA, reason="shard 0 failed"),
    ReplicaStartupTimedOut(replica_id=REPLICA, timeout_s=600, waited_s=601),
    ReplicaLost(replica_id=REPLICA, reason="node gone"),
)
"""Every event that moves replica llama-1, in every phase a writer could record it in."""


def recorded(event: AnyEvent, position: int) -> Recorded:
    return Recorded(
        position=position,
        stream=stream_for(event),
        version=position,
        event_id=uuid.uuid4(),
        recorded_at=T0 + timedelta(seconds=position),
        meta=Meta(actor="test", epoch=1),
        event=event,
    )


def log_of(events: Sequence[AnyEvent]) -> list[Recorded]:
    return [recorded(event, n) for n, event in enumerate(events, start=1)]


def placed_replica() -> ClusterState:
    return replay(
        log_of(
            [
                NodeConnected(node_id="gpu-1", address="127.0.0.1", gpus=gpus(8)),
                ModelDeclared(model="llama", spec=SPEC),
                placement(),
            ]
        )
    )


def every_sequence(
    state: ClusterState, depth: int, path: tuple[AnyEvent, ...] = ()
) -> Iterator[tuple[tuple[AnyEvent, ...], Replica, Replica, ClusterState]]:
    """Each sequence of up to ``depth`` moves after ``state``, step by step: the path so
    far, the replica before and after its last event, and the state after it."""
    if depth == 0:
        return
    for event in MOVES:
        before = state.replicas[REPLICA]
        after_state = state.copy()
        evolve(after_state, recorded(event, state.position + 1))
        step = (*path, event)
        yield step, before, after_state.replicas[REPLICA], after_state
        yield from every_sequence(after_state, depth - 1, step)


def _named(events: Sequence[AnyEvent]) -> str:
    return " -> ".join(type(e).__name__ for e in events)


def test_an_ended_replica_stays_ended_as_it_first_ended_whatever_follows() -> None:
    ended = 0
    for path, before, after, state in every_sequence(placed_replica(), DEPTH):
        if before.phase is ReplicaPhase.STOPPING:
            # Stopping: it ends, or stays stopping, out of routing and of every move.
            assert after.phase in {ReplicaPhase.STOPPING} | ENDED_PHASES, _named(path)
            assert not after.routable, _named(path)
        if before.phase not in ENDED_PHASES:
            continue
        ended += 1
        assert (after.phase, after.ended_at, after.end_reason, after.routable) == (
            before.phase,
            before.ended_at,
            before.end_reason,
            False,
        ), _named(path)
        assert REPLICA not in state.models["llama"].moves, _named(path)
    assert ended > 10_000  # every end, each followed by every event


ENGINE_ENDS = frozenset({ShardPhase.STOPPED, ShardPhase.FAILED})
"""How an engine ends, as its agent reports it."""


def test_an_ended_replica_s_shards_take_only_the_end_of_their_engines_once() -> None:
    ended_engines = 0
    for path, before, after, _ in every_sequence(placed_replica(), DEPTH):
        if before.phase not in ENDED_PHASES:
            continue
        [was], [now] = before.shards, after.shards
        if was.phase in ENGINE_ENDS:
            assert now == was, _named(path)
            continue
        # The engine's end, as its agent reports it, and nothing else: never a start, a
        # ready or an adoption, which would bring the shard of an ended replica back.
        assert now == was or now.phase in ENGINE_ENDS, _named(path)
        assert (now.node_id, now.port, now.pid, now.came_up, now.epoch) == (
            was.node_id,
            was.port,
            was.pid,
            was.came_up,
            was.epoch,
        ), _named(path)
        if isinstance(path[-1], ShardStopped):
            assert now.phase is ShardPhase.STOPPED, _named(path)
            ended_engines += 1
    assert ended_engines > 1_000  # the stop of an engine still running when it ended


def test_a_late_failure_on_a_port_held_elsewhere_marks_the_port_but_not_the_ended_shard() -> None:
    state = placed_replica()
    for n, event in enumerate(
        [
            ShardFailed(replica_id=REPLICA, shard_index=0, node_id="gpu-1", error="exited"),
            ReplicaFailed(replica_id=REPLICA, reason="shard 0 failed: exited"),
            ShardFailed(
                replica_id=REPLICA,
                shard_index=0,
                node_id="gpu-1",
                error="port 20001 is held by pid 99",
                port_held_elsewhere=True,
            ),
        ],
        start=state.position + 1,
    ):
        evolve(state, recorded(event, n))

    # What the node's agent found on the port stands; how the shard failed is its first
    # failure, the one its replica failed for.
    assert state.nodes["gpu-1"].ports_held_elsewhere == (20001,)
    assert state.replicas[REPLICA].shards[0].error == "exited"


def test_a_second_end_counts_no_second_failure() -> None:
    state = placed_replica()
    for n, event in enumerate(
        [
            ReplicaFailed(replica_id=REPLICA, reason="shard 0 failed"),
            ReplicaStartupTimedOut(replica_id=REPLICA, timeout_s=600, waited_s=601),
            ReplicaFailed(replica_id=REPLICA, reason="shard 0 failed again"),
        ],
        start=state.position + 1,
    ):
        evolve(state, recorded(event, n))

    model = state.models["llama"]
    assert model.failures == 1
    assert model.unreplaced_ends == (REPLICA,)
    assert state.replicas[REPLICA].end_reason == "shard 0 failed"


def test_a_replica_placed_again_keeps_the_life_it_had() -> None:
    state = placed_replica()
    for n, event in enumerate(
        [ReplicaStopped(replica_id=REPLICA), placement()], start=state.position + 1
    ):
        evolve(state, recorded(event, n))

    assert state.replicas[REPLICA].phase is ReplicaPhase.STOPPED
    assert state.replicas[REPLICA].phase not in ACTIVE_PHASES


ROLLOUT = "rollout-1"
REVISION_2 = ModelSpec(name="llama", command="sim --new --port {port}", replicas=1)

LATE_ROLLOUT_EVENTS: tuple[AnyEvent, ...] = (
    RolloutStepStarted(model="llama", rollout_id=ROLLOUT, step=1, replicas=1),
    RolloutHolding(model="llama", rollout_id=ROLLOUT, step=1, hold_s=60),
    RolloutVerdict(model="llama", rollout_id=ROLLOUT, step=1, verdict="promote", reason="ok"),
    RolloutPaused(model="llama", rollout_id=ROLLOUT, reason="late pause"),
    RolloutResumed(model="llama", rollout_id=ROLLOUT),
    RolloutRolledBack(model="llama", rollout_id=ROLLOUT, reason="late", to_revision=1, spec=SPEC),
    RolloutFinished(model="llama", rollout_id=ROLLOUT, succeeded=False, outcome="late"),
)


@pytest.mark.parametrize(
    "late", list(itertools.permutations(LATE_ROLLOUT_EVENTS, 2)), ids=lambda late: _named(late)
)
def test_a_finished_rollout_stays_finished_whatever_follows(
    late: tuple[AnyEvent, AnyEvent],
) -> None:
    state = replay(
        log_of(
            [
                ModelDeclared(model="llama", spec=SPEC),
                ModelDeclared(model="llama", spec=REVISION_2, revision=2),
                RolloutStarted(model="llama", rollout_id=ROLLOUT, revision=2, from_revision=1),
                RolloutFinished(model="llama", rollout_id=ROLLOUT, succeeded=True, outcome="done"),
            ]
        )
    )
    finished = state.models["llama"]

    for n, event in enumerate(late, start=state.position + 1):
        evolve(state, recorded(event, n))

    assert state.models["llama"] == finished, _named(late)


def test_a_pass_moving_a_replica_that_ended_since_it_decided_is_not_appended() -> None:
    # Given a pass that moves llama-1 off its GPU, which turned unhealthy ...
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    cluster.serve("llama-1")
    [shard] = cluster.state.replicas["llama-1"].shards
    cluster.given(
        GpuMarkedUnhealthy(node_id=shard.node_id, gpu_index=shard.gpus[0], reason="XID 48")
    )
    stale = cluster.decided()
    assert [m.replica_id for m in of_type(stale, ReplicaDrainStarted)] == ["llama-1"]
    # ... when the log ends llama-1 before the pass appends ...
    cluster.given(ReplicaFailed(replica_id="llama-1", reason="shard 0 failed: exited"))

    # ... then the move is not appended, nor its replacement: the replica stays failed,
    # its place kept for the next placement below the count, and no pass moves it again.
    assert cluster.appended(stale) == replica_stream("llama-1")
    assert cluster.phase("llama-1") is ReplicaPhase.FAILED
    assert cluster.state.models["llama"].moves == {}
    assert cluster.state.models["llama"].unreplaced_ends == ("llama-1",)
    assert of_type(cluster.reconcile(), ReplicaDrainStarted) == []


@pytest.mark.parametrize(
    "late",
    list(
        itertools.permutations(
            (
                *LATE_ROLLOUT_EVENTS,
                RolloutFinished(model="llama", rollout_id=ROLLOUT, succeeded=True, outcome="late"),
                # Decided before the model was scaled to 3: it would scale it back to 1.
                RolloutRolledBack(
                    model="llama",
                    rollout_id=ROLLOUT,
                    reason="late",
                    to_revision=1,
                    spec=replace(SPEC, replicas=1),
                ),
            ),
            2,
        )
    ),
    ids=lambda late: _named(late),
)
def test_a_rollout_rolling_back_takes_only_its_finish_as_rolled_back(
    late: tuple[AnyEvent, AnyEvent],
) -> None:
    state = replay(
        log_of(
            [
                ModelDeclared(model="llama", spec=SPEC),
                ModelDeclared(model="llama", spec=REVISION_2, revision=2),
                RolloutStarted(model="llama", rollout_id=ROLLOUT, revision=2, from_revision=1),
                RolloutRolledBack(
                    model="llama", rollout_id=ROLLOUT, reason="undone", to_revision=1, spec=SPEC
                ),
                ModelDeclared(model="llama", spec=replace(SPEC, replicas=3)),
            ]
        )
    )
    rolling_back = state.models["llama"]
    assert rolling_back.rollout is not None
    finished = False

    for n, event in enumerate(late, start=state.position + 1):
        evolve(state, recorded(event, n))
        finished = finished or (isinstance(event, RolloutFinished) and not event.succeeded)

        model = state.models["llama"]
        rollout = model.rollout
        assert rollout is not None
        assert (model.spec, model.revision, model.failures) == (
            rolling_back.spec,
            rolling_back.revision,
            rolling_back.failures,
        ), _named(late)
        assert rollout.state is (
            RolloutState.ROLLED_BACK if finished else RolloutState.ROLLING_BACK
        ), _named(late)
        if finished:  # its finish says when and how it ended, and nothing else
            rollout = replace(
                rollout,
                state=RolloutState.ROLLING_BACK,
                finished_at=None,
                outcome=rolling_back.rollout.outcome,
            )
        assert rollout == rolling_back.rollout, _named(late)
