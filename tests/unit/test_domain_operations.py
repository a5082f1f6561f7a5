"""Stories of what operators ask and what the log records because of it.

Given the events already in the log, when an operator asks for something, then these
events (and only these) are recorded, or the request is refused with a reason an operator
can act on. Asking for what is already so records nothing.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from app.domain import model_operations as model_ops
from app.domain import node_operations as node_ops
from app.domain.drain import NODE_DRAIN_COMPLETE, NODE_DRAIN_GRACE_RAN_OUT
from app.domain.drain_progress import DrainState, drain_progress
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    GpuInfo,
    ModelDeclared,
    ModelRemoved,
    ModelScaled,
    ModelTuned,
    ModelUnplaceable,
    NodeConnected,
    NodeCordoned,
    NodeDrainCancelled,
    NodeDrainFinished,
    NodeDrainRequested,
    NodeRegistered,
    NodeUncordoned,
    ReplacementServing,
    ReplicaDrainCancelled,
    ReplicaDrainStarted,
    ReplicaFailed,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    ReplicaStopping,
    RolloutStarted,
    ShardPlacement,
    ShardStarting,
    model_stream,
    node_stream,
    replica_stream,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.domain.model_status import model_status
from app.domain.operation_results import (
    Change,
    InvalidOperation,
    InvalidSpec,
    InvalidText,
    UnknownDrain,
    UnknownModel,
    UnknownNode,
    UnknownReplica,
)
from app.domain.revisions import SpecChange
from app.domain.state import ClusterState, ReplicaPhase, backoff_s

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
LLAMA = ModelSpec(name="llama", command="vllm serve {model} --port {port}", replicas=2)


def log(*events: AnyEvent | tuple[AnyEvent, str]) -> list[Recorded]:
    """Events as recorded one second apart; ``(event, correlation_id)`` for correlated ones."""
    recorded = []
    for n, item in enumerate(events, start=1):
        event, correlation = item if isinstance(item, tuple) else (item, None)
        recorded.append(
            Recorded(
                position=n,
                stream="any",
                version=n,
                event_id=uuid.uuid4(),
                recorded_at=T0 + timedelta(seconds=n),
                meta=Meta(actor="alice" if n == 1 else "reconciler", correlation_id=correlation),
                event=event,
            )
        )
    return recorded


def given(*events: AnyEvent) -> ClusterState:
    return replay(log(*events))


def after(state: ClusterState, change: Change) -> ClusterState:
    """``state`` with ``change`` recorded."""
    return replay(
        (
            Recorded(
                position=state.position + n,
                stream=change.stream,
                version=n,
                event_id=uuid.uuid4(),
                recorded_at=T0 + timedelta(hours=1),
                meta=Meta(actor="alice"),
                event=event,
            )
            for n, event in enumerate(change.events, start=1)
        ),
        state,
    )


def gpu(index: int, *, healthy: bool = True, machine: str = "a") -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{machine}-{index}",
        name="H100",
        memory_total_mib=81559,
        healthy=healthy,
        unhealthy_reason=None if healthy else "XID 79: fell off the bus",
    )


def node(node_id: str, *gpus: GpuInfo) -> tuple[NodeRegistered, NodeConnected]:
    return (
        NodeRegistered(node_id=node_id, address="127.0.0.7", gpus=gpus),
        NodeConnected(node_id=node_id, address="127.0.0.7", gpus=gpus),
    )


def placed(model: str, number: int, node_id: str, replaces: str | None = None) -> ReplicaPlaced:
    return ReplicaPlaced(
        replica_id=f"{model}-{number}",
        model=model,
        number=number,
        shards=(ShardPlacement(index=0, node_id=node_id, gpus=(0,), port=20000 + number),),
        replaces=replaces,
    )


# -- declaring models --------------------------------------------------------------------


def test_a_new_model_is_declared_with_its_spec() -> None:
    change = model_ops.apply_model(given(), LLAMA)

    assert change == Change(
        stream=model_stream("llama"), events=(ModelDeclared(model="llama", spec=LLAMA),)
    )


def test_applying_the_same_spec_again_records_nothing() -> None:
    state = after(given(), model_ops.apply_model(given(), LLAMA))

    assert model_ops.apply_model(state, LLAMA).events == ()


def test_a_changed_spec_is_declared_again_and_its_replica_count_comes_with_it() -> None:
    changed = ModelSpec(name="llama", command=LLAMA.command, replicas=5, gpus_per_shard=2)

    change = model_ops.apply_model(given(ModelDeclared(model="llama", spec=LLAMA)), changed)

    # Two GPUs a shard change what runs: revision 2 (tests/unit/test_revisions.py).
    gpus = SpecChange(field="gpus_per_shard", old="1", new="2")
    assert change.events == (
        ModelDeclared(model="llama", spec=changed, revision=2, changes=(gpus,)),
        RolloutStarted(model="llama", rollout_id="rollout-llama-r2", revision=2, from_revision=1),
    )


def test_re_applying_a_spec_without_routing_keeps_the_measured_routing() -> None:
    tuned = ModelTuned(model="llama", weight=7.5, target_waiting=12, kv_ceiling=0.9)
    state = given(ModelDeclared(model="llama", spec=LLAMA), tuned)

    assert model_ops.apply_model(state, LLAMA).events == ()
    rescaled = model_ops.apply_model(state, msgspec.structs.replace(LLAMA, replicas=4))
    declared = rescaled.events[0]
    assert isinstance(declared, ModelDeclared)
    assert declared.spec.routing == RoutingSettings(weight=7.5, target_waiting=12, kv_ceiling=0.9)


def test_routing_written_in_a_spec_replaces_the_measured_routing() -> None:
    tuned = ModelTuned(model="llama", weight=7.5, target_waiting=12, kv_ceiling=0.9)
    state = given(ModelDeclared(model="llama", spec=LLAMA), tuned)
    written = msgspec.structs.replace(LLAMA, routing=RoutingSettings(target_waiting=3))

    assert model_ops.apply_model(state, written).events == (
        ModelDeclared(model="llama", spec=written),
    )


def test_a_removed_model_is_declared_again_by_applying_its_spec() -> None:
    state = given(ModelDeclared(model="llama", spec=LLAMA), ModelRemoved(model="llama"))

    assert model_ops.apply_model(state, LLAMA).events == (ModelDeclared(model="llama", spec=LLAMA),)


def test_an_invalid_spec_is_refused_with_every_field_and_reason() -> None:
    bad = ModelSpec(
        name="Llama 3",
        command="vllm serve {model} --tp {tensor_parallel}",
        gpus_per_shard=0,
        replicas=-1,
        routing=RoutingSettings(kv_ceiling=1.5),
    )

    with pytest.raises(InvalidSpec) as refused:
        model_ops.apply_model(given(), bad)

    fields = [error.field for error in refused.value.errors]
    assert fields == ["name", "command", "gpus_per_shard", "replicas", "routing.kv_ceiling"]
    assert "unknown placeholder(s) tensor_parallel" in str(refused.value)
    assert "nothing was recorded" in str(refused.value)


# -- scaling and removing ----------------------------------------------------------------


def test_scaling_records_the_new_count_and_the_previous_one() -> None:
    state = given(ModelDeclared(model="llama", spec=LLAMA))

    change = model_ops.scale(state, "llama", 4)

    assert change.events == (ModelScaled(model="llama", replicas=4, previous=2),)
    assert model_ops.scale(after(state, change), "llama", 4).events == ()


def test_scaling_to_a_count_out_of_range_names_the_field() -> None:
    with pytest.raises(InvalidSpec) as refused:
        model_ops.scale(given(ModelDeclared(model="llama", spec=LLAMA)), "llama", -1)

    assert [(e.field, e.reason) for e in refused.value.errors] == [
        ("replicas", "must be between 0 and 10000")
    ]


def test_an_unknown_or_removed_model_cannot_be_scaled() -> None:
    with pytest.raises(UnknownModel) as unknown:
        model_ops.scale(given(), "mistral", 1)
    assert unknown.value.key == "mistral"

    removed = given(ModelDeclared(model="llama", spec=LLAMA), ModelRemoved(model="llama"))
    with pytest.raises(InvalidOperation, match="llama was removed; apply its spec"):
        model_ops.scale(removed, "llama", 1)


def test_removing_a_model_twice_records_it_once() -> None:
    state = given(ModelDeclared(model="llama", spec=LLAMA))

    change = model_ops.remove(state, "llama")

    assert change.events == (ModelRemoved(model="llama"),)
    assert model_ops.remove(after(state, change), "llama").events == ()
    with pytest.raises(UnknownModel):
        model_ops.remove(state, "mistral")


# -- nodes -------------------------------------------------------------------------------


def test_cordon_and_uncordon_are_recorded_once_each() -> None:
    state = given(*node("gpu-1", gpu(0)))

    cordoned = node_ops.cordon(state, "gpu-1", "firmware update")
    state = after(state, cordoned)
    uncordoned = node_ops.uncordon(state, "gpu-1")

    assert cordoned == Change(
        stream=node_stream("gpu-1"),
        events=(NodeCordoned(node_id="gpu-1", reason="firmware update"),),
    )
    assert node_ops.cordon(state, "gpu-1", "firmware update").events == ()
    assert uncordoned.events == (NodeUncordoned(node_id="gpu-1"),)
    assert node_ops.uncordon(after(state, uncordoned), "gpu-1").events == ()


def test_a_cordoned_node_cordoned_with_another_reason_records_the_new_one() -> None:
    state = given(*node("gpu-1", gpu(0)), NodeCordoned(node_id="gpu-1", reason="fan noise"))

    recut = node_ops.cordon(state, "gpu-1", "ECC errors on GPU 3")

    assert recut == Change(
        stream=node_stream("gpu-1"),
        events=(NodeCordoned(node_id="gpu-1", reason="ECC errors on GPU 3"),),
    )
    state = after(state, recut)
    held = state.nodes["gpu-1"]
    assert (held.cordoned, held.cordon_reason) == (True, "ECC errors on GPU 3")
    assert node_ops.cordon(state, "gpu-1", "ECC errors on GPU 3").events == ()
    assert node_ops.cordon(state, "gpu-1", "").events == (), "no reason keeps the one recorded"


def test_a_cordon_reason_over_500_characters_is_refused_naming_it_even_on_a_cordoned_node() -> None:
    state = given(*node("gpu-1", gpu(0)))
    cordoned = after(state, node_ops.cordon(state, "gpu-1", "x" * 500))

    for before in (state, cordoned):
        with pytest.raises(InvalidText) as refused:
            node_ops.cordon(before, "gpu-1", "x" * 501)

        assert [(e.field, e.reason) for e in refused.value.errors] == [
            ("reason", "at most 500 characters, not 501")
        ]


def test_an_unknown_node_is_named() -> None:
    with pytest.raises(UnknownNode, match="no node 'gpu-9' is known"):
        node_ops.cordon(given(), "gpu-9", "")


def test_draining_a_node_records_the_request_with_its_id_and_grace() -> None:
    change = node_ops.drain_node(given(*node("gpu-1", gpu(0))), "gpu-1", "drain-0a1b2c3d", 300.0)

    assert change.events == (
        NodeDrainRequested(node_id="gpu-1", drain_id="drain-0a1b2c3d", grace_s=300.0),
    )


def test_a_draining_node_cannot_be_drained_again_nor_uncordoned_and_says_which_drain() -> None:
    state = given(
        *node("gpu-1", gpu(0)),
        NodeDrainRequested(node_id="gpu-1", drain_id="drain-0a1b2c3d", grace_s=300.0),
    )

    with pytest.raises(InvalidOperation, match="already draining \\(drain drain-0a1b2c3d"):
        node_ops.drain_node(state, "gpu-1", "drain-ffffffff", 300.0)
    with pytest.raises(InvalidOperation) as uncordon_refused:
        node_ops.uncordon(state, "gpu-1")

    assert str(uncordon_refused.value) == (
        "node gpu-1 is draining (drain drain-0a1b2c3d since 2026-11-02 09:00:03); it can be "
        "uncordoned once that drain has finished; follow it with `llmgw-cli drain-progress "
        "drain-0a1b2c3d` (GET /admin/v1/drains/drain-0a1b2c3d), or call it off with "
        "`llmgw-cli drain-cancel drain-0a1b2c3d` (POST /admin/v1/drains/drain-0a1b2c3d/cancel)"
    )


def test_a_cordon_of_a_draining_node_is_refused_saying_its_reason_was_not_kept() -> None:
    state = given(
        *node("gpu-1", gpu(0)),
        NodeDrainRequested(node_id="gpu-1", drain_id="drain-0a1b2c3d", grace_s=300.0),
    )

    with pytest.raises(InvalidOperation) as refused:
        node_ops.cordon(state, "gpu-1", "ECC errors on GPU 3")
    with pytest.raises(InvalidOperation, match="cordoned by its drain") as unexplained:
        node_ops.cordon(state, "gpu-1", "")

    assert str(refused.value) == (
        "node gpu-1 is already cordoned by its drain (drain drain-0a1b2c3d since "
        "2026-11-02 09:00:03): the cordon was not recorded, and its reason 'ECC errors on "
        "GPU 3' was not kept; follow it with `llmgw-cli drain-progress drain-0a1b2c3d` "
        "(GET /admin/v1/drains/drain-0a1b2c3d), or call it off with `llmgw-cli drain-cancel "
        "drain-0a1b2c3d` (POST /admin/v1/drains/drain-0a1b2c3d/cancel)"
    )
    assert "reason" not in str(unexplained.value)


def test_a_node_whose_drain_finished_can_be_drained_again() -> None:
    state = given(
        *node("gpu-1", gpu(0)),
        NodeDrainRequested(node_id="gpu-1", drain_id="drain-0a1b2c3d", grace_s=300.0),
        NodeDrainFinished(node_id="gpu-1", drain_id="drain-0a1b2c3d", outcome="moved"),
    )

    change = node_ops.drain_node(state, "gpu-1", "drain-ffffffff", 60.0)

    assert [type(e) for e in change.events] == [NodeDrainRequested]


# -- replicas ----------------------------------------------------------------------------


def test_a_serving_replica_is_drained_on_its_own() -> None:
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        placed("llama", 1, "gpu-1"),
        ReplicaServing(replica_id="llama-1"),
    )

    change = node_ops.drain_replica(state, "llama-1", "drain-0a1b2c3d")

    assert change.stream == replica_stream("llama-1")
    [started] = change.events
    assert isinstance(started, ReplicaDrainStarted)
    assert (started.replica_id, started.drain_id) == ("llama-1", "drain-0a1b2c3d")


@pytest.mark.parametrize(
    ("history", "why"),
    [
        ((), "it is placed and not serving yet, so there is nothing to move"),
        (
            (ShardStarting(replica_id="llama-1", shard_index=0, node_id="gpu-1"),),
            "it is starting and not serving yet",
        ),
        (
            (
                ReplicaServing(replica_id="llama-1"),
                ReplicaDrainStarted(replica_id="llama-1", drain_id="drain-0a1b2c3d"),
            ),
            "it is already draining (drain drain-0a1b2c3d)",
        ),
        (
            (ReplicaStopping(replica_id="llama-1", reason="scaled down to 1"),),
            "it is already stopping (scaled down to 1)",
        ),
        (
            (ReplicaFailed(replica_id="llama-1", reason="shard 0 on gpu-1 failed: OOM"),),
            "it has ended (failed: shard 0 on gpu-1 failed: OOM)",
        ),
    ],
)
def test_only_a_serving_replica_can_be_drained_and_the_refusal_says_why(
    history: tuple[AnyEvent, ...], why: str
) -> None:
    state = given(ModelDeclared(model="llama", spec=LLAMA), placed("llama", 1, "gpu-1"), *history)

    with pytest.raises(InvalidOperation) as refused:
        node_ops.drain_replica(state, "llama-1", "drain-ffffffff")

    assert str(refused.value).startswith(f"replica llama-1 cannot be drained: {why}")


def test_an_unknown_replica_is_named() -> None:
    with pytest.raises(UnknownReplica) as unknown:
        node_ops.drain_replica(given(), "llama-7", "drain-ffffffff")
    assert unknown.value.key == "llama-7"


def test_replicas_are_found_by_model_node_and_phase() -> None:
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        placed("llama", 1, "gpu-1"),
        placed("llama", 2, "gpu-2"),
        placed("qwen", 1, "gpu-1"),
        ReplicaServing(replica_id="llama-2"),
    )

    def ids(
        model: str | None = None, node_id: str | None = None, phase: ReplicaPhase | None = None
    ) -> list[str]:
        return [r.id for r in node_ops.replicas_matching(state, model, node_id, phase)]

    assert ids() == ["llama-1", "llama-2", "qwen-1"]
    assert ids(model="llama") == ["llama-1", "llama-2"]
    assert ids(node_id="gpu-1") == ["llama-1", "qwen-1"]
    assert ids(model="llama", phase=ReplicaPhase.SERVING) == ["llama-2"]


# -- why a model is below its count ------------------------------------------------------


def test_a_model_with_every_replica_serving_has_no_reason_to_give() -> None:
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        placed("llama", 1, "gpu-1"),
        placed("llama", 2, "gpu-2"),
        ReplicaServing(replica_id="llama-1"),
        ReplicaServing(replica_id="llama-2"),
    )

    status = model_status(state, "llama", T0)

    assert (status.model.desired, status.serving, status.counting) == (2, 2, 2)
    assert status.phases == {"serving": 2}
    assert status.below_desired_because == ()


def test_an_unplaceable_model_says_why_and_what_is_still_starting() -> None:
    reason = "needs 1 node(s) with 1 healthy free GPU(s), 0 eligible of 1: 1 cordoned"
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        placed("llama", 1, "gpu-1"),
        ModelUnplaceable(model="llama", reason=reason),
    )

    status = model_status(state, "llama", T0)

    assert status.model.unplaceable_reason == reason
    assert status.below_desired_because == (
        f"cannot place 1 replica(s): {reason}",
        "1 replica(s) placed or starting, not serving yet",
    )


def test_a_model_backing_off_after_failures_says_until_when_and_the_last_failure() -> None:
    state = given(
        ModelDeclared(model="llama", spec=ModelSpec(name="llama", command="x", replicas=1)),
        placed("llama", 1, "gpu-1"),
        ReplicaFailed(replica_id="llama-1", reason="shard 0 on gpu-1 failed: CUDA OOM"),
    )
    failed_at = T0 + timedelta(seconds=3)
    until = failed_at + timedelta(seconds=backoff_s(1))

    waiting = model_status(state, "llama", failed_at)
    later = model_status(state, "llama", until + timedelta(seconds=1))

    assert waiting.model.backoff_until == until
    assert waiting.phases == {"failed": 1}
    assert waiting.below_desired_because == (
        f"placement waits until {until:%Y-%m-%d %H:%M:%S} after 1 failure",
        "1 failure (a start that failed or an engine that crashed within 60s of serving): "
        "llama-1 failed, shard 0 on gpu-1 failed: CUDA OOM",
    )
    assert later.below_desired_because[0] == "1 replica(s) not placed yet"


def test_the_failures_in_a_row_count_engines_that_crashed_soon_after_serving_and_say_so() -> None:
    # Before, "2 failed start(s) in a row": but llama-2 started, served, then crashed.
    state = given(
        ModelDeclared(model="llama", spec=ModelSpec(name="llama", command="x", replicas=1)),
        placed("llama", 1, "gpu-1"),
        ReplicaFailed(replica_id="llama-1", reason="shard 0 on gpu-1 failed: CUDA OOM"),
        placed("llama", 2, "gpu-1"),
        ReplicaServing(replica_id="llama-2"),
        ReplicaFailed(replica_id="llama-2", reason="shard 0 on gpu-1 failed: exit 139"),
    )
    failed_at = T0 + timedelta(seconds=6)

    status = model_status(state, "llama", failed_at)

    assert status.model.failures == 2
    assert status.below_desired_because == (
        f"placement waits until {status.model.backoff_until:%Y-%m-%d %H:%M:%S} after 2 "
        "failures in a row",
        "2 failures in a row (starts that failed or engines that crashed within 60s of "
        "serving): llama-2 failed, shard 0 on gpu-1 failed: exit 139",
    )


def test_the_last_failure_of_a_startup_timeout_reads_as_its_end_reason() -> None:
    # Before, "llama-1 timed_out, not ready after 300s (timeout 300s)".
    state = given(
        ModelDeclared(model="llama", spec=ModelSpec(name="llama", command="x", replicas=1)),
        placed("llama", 1, "gpu-1"),
        ReplicaStartupTimedOut(replica_id="llama-1", timeout_s=300, waited_s=300),
    )

    status = model_status(state, "llama", T0 + timedelta(seconds=3))

    assert status.below_desired_because[-1].endswith(
        ": llama-1 timed out starting after 300s (limit 300s)"
    )


def test_a_draining_replica_no_longer_counts_but_is_named() -> None:
    state = given(
        ModelDeclared(model="llama", spec=ModelSpec(name="llama", command="x", replicas=1)),
        placed("llama", 1, "gpu-1"),
        ReplicaServing(replica_id="llama-1"),
        ReplicaDrainStarted(replica_id="llama-1", drain_id="drain-0a1b2c3d"),
        placed("llama", 2, "gpu-2", replaces="llama-1"),
    )

    status = model_status(state, "llama", T0)

    assert (status.serving, status.counting) == (0, 1)
    assert status.below_desired_because == (
        "1 replica(s) placed or starting, not serving yet",
        "1 replica(s) draining: they serve until their replacements do",
    )


def test_the_status_of_an_unknown_model_is_refused() -> None:
    with pytest.raises(UnknownModel):
        model_status(given(), "mistral", T0)


# -- placement ---------------------------------------------------------------------------


def test_placement_is_explained_for_a_declared_model_and_for_a_dry_run() -> None:
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        *node("gpu-1", gpu(0, healthy=False)),
        *node("gpu-2", gpu(0, machine="b")),
    )

    declared = model_ops.placement_of(state, "llama")
    dry_run = model_ops.placement_dry_run(
        state, ModelSpec(name="big", command="x", gpus_per_shard=2)
    )

    assert declared.placement is not None
    assert [s.node_id for s in declared.placement] == ["gpu-2"]
    assert declared.candidates[0].reasons == (
        "needs 1 healthy GPU(s), has 0: GPU 0 unhealthy (XID 79: fell off the bus)",
    )
    assert dry_run.placement is None
    assert dry_run.summary.endswith("2 not enough healthy free GPUs")


def test_an_invalid_dry_run_spec_is_refused_like_an_apply() -> None:
    with pytest.raises(InvalidSpec) as refused:
        model_ops.placement_dry_run(given(), ModelSpec(name="x", command=""))
    assert [e.field for e in refused.value.errors] == ["command"]


# -- drain progress ----------------------------------------------------------------------

DRAIN = "drain-0a1b2c3d"


def test_a_node_drain_in_progress_shows_what_moves_and_what_waits() -> None:
    events = log(
        (NodeDrainRequested(node_id="gpu-1", drain_id=DRAIN, grace_s=600.0), DRAIN),
        (ReplicaDrainStarted(replica_id="llama-1", drain_id=DRAIN), DRAIN),
        (placed("llama", 3, "gpu-2", replaces="llama-1"), DRAIN),
    )
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        *node("gpu-1", gpu(0), gpu(1)),
        placed("llama", 1, "gpu-1"),
        placed("llama", 2, "gpu-1"),
        ReplicaServing(replica_id="llama-1"),
        ReplicaServing(replica_id="llama-2"),
        *(recorded.event for recorded in events),
    )

    progress = drain_progress(state, DRAIN, events)

    assert (progress.node_id, progress.requested_by, progress.grace_s) == ("gpu-1", "alice", 600)
    assert not progress.finished
    assert [(r.id, r.phase) for r in progress.replicas] == [
        ("llama-1", ReplicaPhase.DRAINING),
        ("llama-3", ReplicaPhase.PLACED),
    ]
    assert progress.still_on_node == ("llama-2",)


def test_a_cancelled_drain_counts_the_replica_whose_move_was_called_off_as_still_on_node() -> None:
    # Before, still_on_node named only llama-2, which the drain never reached: llama-1,
    # whose move was called off, serves on the node too but was left out.
    events = log(
        (NodeDrainRequested(node_id="gpu-1", drain_id=DRAIN, grace_s=600.0), DRAIN),
        (ReplicaDrainStarted(replica_id="llama-1", drain_id=DRAIN), DRAIN),
        (placed("llama", 3, "gpu-2", replaces="llama-1"), DRAIN),
        (NodeDrainCancelled(node_id="gpu-1", drain_id=DRAIN), DRAIN),
        (ReplicaDrainCancelled(replica_id="llama-1", drain_id=DRAIN, reason="serves on"), DRAIN),
        (ReplicaStopping(replica_id="llama-3", reason="not needed", surplus=True), DRAIN),
        (NodeDrainFinished(node_id="gpu-1", drain_id=DRAIN, outcome="cancelled by bob"), DRAIN),
    )
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        *node("gpu-1", gpu(0), gpu(1)),
        *node("gpu-2", gpu(0)),
        placed("llama", 1, "gpu-1"),
        placed("llama", 2, "gpu-1"),
        ReplicaServing(replica_id="llama-1"),
        ReplicaServing(replica_id="llama-2"),
        *(recorded.event for recorded in events),
    )

    progress = drain_progress(state, DRAIN, events)

    assert progress.state is DrainState.CANCELLED
    assert progress.still_on_node == ("llama-1", "llama-2")
    assert progress.moves_called_off == ("llama-1",)
    assert [r.id for r in progress.replicas] == ["llama-1", "llama-3"]


def test_a_finished_node_drain_says_how_it_ended() -> None:
    events = log(
        (NodeDrainRequested(node_id="gpu-1", drain_id=DRAIN, grace_s=600.0), DRAIN),
        (NodeDrainFinished(node_id="gpu-1", drain_id=DRAIN, outcome="every replica moved"), DRAIN),
    )

    progress = drain_progress(given(*node("gpu-1", gpu(0))), DRAIN, events)

    assert progress.finished
    assert progress.outcome == "every replica moved"


NOT_NEEDED = "every replica moved or was not needed: 0 moved; 1 stopped with its model at ..."


@pytest.mark.parametrize(
    ("outcome", "succeeded", "expected"),
    [
        (None, None, DrainState.RUNNING),
        (NODE_DRAIN_COMPLETE, True, DrainState.SUCCEEDED),
        (NOT_NEEDED, True, DrainState.SUCCEEDED),
        (NODE_DRAIN_GRACE_RAN_OUT, False, DrainState.FAILED),
        # Recorded before drains said whether they succeeded: judged by the outcome's words.
        (NODE_DRAIN_COMPLETE, None, DrainState.SUCCEEDED),
        (NODE_DRAIN_GRACE_RAN_OUT, None, DrainState.FAILED),
    ],
)
def test_a_node_drain_states_whether_it_runs_moved_everything_or_ran_out_of_grace(
    outcome: str | None, succeeded: bool | None, expected: DrainState
) -> None:
    requested = NodeDrainRequested(node_id="gpu-1", drain_id=DRAIN, grace_s=600.0)
    finished = NodeDrainFinished(
        node_id="gpu-1", drain_id=DRAIN, outcome=outcome or "", succeeded=succeeded
    )
    events = log((requested, DRAIN), *([(finished, DRAIN)] if outcome is not None else []))

    progress = drain_progress(given(*node("gpu-1", gpu(0))), DRAIN, events)

    assert progress.state is expected
    assert progress.finished is (expected is not DrainState.RUNNING)


def test_a_replica_drain_fails_when_the_replica_stopped_before_it_was_replaced() -> None:
    stopping = ReplicaStopping(
        replica_id="llama-1", reason=f"drain {DRAIN}: grace ran out before it could move"
    )
    events = log(
        (ReplicaDrainStarted(replica_id="llama-1", drain_id=DRAIN), DRAIN),
        (stopping, DRAIN),
        (ReplicaStopped(replica_id="llama-1"), DRAIN),
    )
    history = (
        ModelDeclared(model="llama", spec=LLAMA),
        placed("llama", 1, "gpu-1"),
        ReplicaServing(replica_id="llama-1"),
    )

    moving = drain_progress(given(*history, *(e.event for e in events[:2])), DRAIN, events)
    done = drain_progress(given(*history, *(e.event for e in events)), DRAIN, events)

    assert moving.state is DrainState.RUNNING
    assert done.state is DrainState.FAILED
    assert done.outcome == f"llama-1 drain {DRAIN}: grace ran out before it could move"


def test_a_replica_drain_succeeds_when_its_model_had_its_count_without_the_replica() -> None:
    stopping = ReplicaStopping(replica_id="llama-1", reason="scaled down to 1", surplus=True)
    events = log(
        (ReplicaDrainStarted(replica_id="llama-1", drain_id=DRAIN), DRAIN),
        (stopping, DRAIN),
        (ReplicaStopped(replica_id="llama-1"), DRAIN),
    )
    history = (
        ModelDeclared(model="llama", spec=LLAMA),
        placed("llama", 1, "gpu-1"),
        ReplicaServing(replica_id="llama-1"),
    )

    done = drain_progress(given(*history, *(e.event for e in events)), DRAIN, events)

    assert done.state is DrainState.SUCCEEDED
    assert done.outcome == "llama-1 scaled down to 1"


def test_a_replica_drain_finishes_when_the_replica_has_stopped() -> None:
    stopping = ReplicaStopping(replica_id="llama-1", reason=f"drain {DRAIN}: replacement served")
    events = log(
        (ReplicaDrainStarted(replica_id="llama-1", drain_id=DRAIN), DRAIN),
        (placed("llama", 2, "gpu-2", replaces="llama-1"), DRAIN),
        (ReplacementServing(replica_id="llama-1", replacement_id="llama-2"), DRAIN),
        (stopping, DRAIN),
        (ReplicaStopped(replica_id="llama-1"), DRAIN),
    )
    history = (
        ModelDeclared(model="llama", spec=LLAMA),
        placed("llama", 1, "gpu-1"),
        ReplicaServing(replica_id="llama-1"),
    )

    moving = drain_progress(given(*history, *(e.event for e in events[:4])), DRAIN, events)
    done = drain_progress(given(*history, *(e.event for e in events)), DRAIN, events)

    assert moving.node_id is None
    assert not moving.finished
    assert done.finished
    assert done.outcome == f"llama-1 drain {DRAIN}: replacement served"
    assert (moving.state, done.state) == (DrainState.RUNNING, DrainState.SUCCEEDED)


def test_a_drain_with_no_events_is_unknown() -> None:
    with pytest.raises(UnknownDrain, match="no drain 'drain-ffffffff' is known"):
        drain_progress(given(), "drain-ffffffff", [])
