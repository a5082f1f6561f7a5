"""``explain-placement`` during a rollout answers for the replacement the rollout places
next: the model's current spec (the new revision's, or the old one's again once rolled
back), against the GPUs its replicas of both revisions hold now."""

from __future__ import annotations

from msgspec.structs import replace

from app.domain import model_operations as model_ops
from app.domain import rollout_operations as rollouts
from app.domain.events import ReplicaPlaced
from tests.unit.test_reconcile import of_type, with_two_nodes_and_a_model


def test_explain_placement_is_for_the_revision_being_rolled_out_and_where_it_would_go() -> None:
    cluster = with_two_nodes_and_a_model(replicas=4)  # two of 8 GPUs in use on each node
    cluster.reconcile()
    for replica_id in sorted(cluster.state.replicas):
        cluster.serve(replica_id)
    wider = replace(cluster.state.models["llama"].spec, gpus_per_shard=6)
    cluster.given(*model_ops.apply_model(cluster.state, wider).events)

    explained = model_ops.placement_of(cluster.state, "llama")
    cluster.reconcile()  # the step starts
    placed = of_type(cluster.reconcile(), ReplicaPlaced)  # the first move's replacement

    assert explained.gpus_per_shard == 6
    assert explained.placement is not None
    assert [(p.replaces, p.revision, p.shards) for p in placed] == [
        ("llama-1", 2, explained.placement)
    ]
    # The next replacement can only go to the other node; the first says why, GPU by GPU.
    after = model_ops.placement_of(cluster.state, "llama")
    reasons = {c.node_id: c.reasons for c in after.candidates}
    assert reasons["gpu-1"] == (
        "needs 6 healthy GPU(s), has 0: GPU 0 used by llama-1, GPU 1 used by llama-3, "
        + ", ".join(f"GPU {g} used by llama-5" for g in range(2, 8)),
    )
    assert reasons["gpu-2"] == ()
    assert after.placement is not None
    assert after.placement[0].node_id == "gpu-2"


def test_after_an_undo_it_is_for_the_revision_rolled_back_to() -> None:
    cluster = with_two_nodes_and_a_model(replicas=2)
    cluster.reconcile()
    for replica_id in sorted(cluster.state.replicas):
        cluster.serve(replica_id)
    wider = replace(cluster.state.models["llama"].spec, gpus_per_shard=4)
    cluster.given(*model_ops.apply_model(cluster.state, wider).events)

    cluster.given(*rollouts.undo(cluster.state, "llama").events)

    assert model_ops.placement_of(cluster.state, "llama").gpus_per_shard == 1
