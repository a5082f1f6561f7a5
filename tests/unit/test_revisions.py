"""Stories of model revisions: a spec change that alters what runs is the next revision,
with what changed; replicas keep the revision they were placed with; old events read as
revision 1."""

from __future__ import annotations

import msgspec
import pytest
from msgspec.structs import replace

from app.domain import model_operations as model_ops
from app.domain.commands import StartShard
from app.domain.describe import describe
from app.domain.events import (
    ModelDeclared,
    ModelRemoved,
    ModelScaled,
    ModelTuned,
    ReplicaPlaced,
    ReplicaStopped,
    RolloutStarted,
    ShardStopped,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.domain.model_status import model_status
from app.domain.operation_results import Change
from app.domain.reports import NodeReport
from app.domain.revisions import REVISION_FIELDS, WITHHELD, SpecChange, describe_changes
from app.store.codec import decode_event
from tests.unit.test_domain_operations import after, given, log
from tests.unit.test_reconcile import of_type, with_two_nodes_and_a_model

LLAMA = ModelSpec(name="llama", command="vllm serve {model} --port {port}", replicas=2)


def declared(change: Change, *, removed: bool = False) -> ModelDeclared:
    """The declaration ``change`` records; a new revision's comes with its rollout (not
    when the model was removed: nothing runs to roll out)."""
    event, *rest = change.events
    assert isinstance(event, ModelDeclared)
    started = (
        [
            RolloutStarted(
                model=event.model,
                rollout_id=f"rollout-{event.model}-r{event.revision}",
                revision=event.revision,
                from_revision=event.revision - 1,
            )
        ]
        if event.changes and not removed
        else []
    )
    assert rest == started
    return event


def test_the_first_declaration_is_revision_1_with_nothing_changed() -> None:
    first = declared(model_ops.apply_model(given(), LLAMA))

    assert (first.revision, first.changes) == (1, ())
    assert given(first).models["llama"].revision == 1
    assert describe(first) == (
        "model llama declared (revision 1): 2 replica(s) x 1 shard(s) x 1 GPU(s), engine vllm"
    )


def test_a_command_change_is_revision_2_with_the_old_and_new_command() -> None:
    state = given(ModelDeclared(model="llama", spec=LLAMA))
    upgraded = replace(LLAMA, command="vllm serve {model} --port {port} --enable-prefix-caching")

    second = declared(model_ops.apply_model(state, upgraded))

    assert second.revision == 2
    assert second.changes == (SpecChange(field="command", old=LLAMA.command, new=upgraded.command),)
    now = after(state, Change(stream="model-llama", events=(second,)))
    assert now.models["llama"].revision == 2
    assert describe(second) == (
        "model llama revision 2: command '...--port {port}' -> "
        "'...--port {port} --enable-prefix-caching'"
    )


def test_an_env_change_names_the_variables_and_never_their_values() -> None:
    before = replace(LLAMA, env={"HF_ENDPOINT": "hf_oldsecret", "DEBUG": "0", "GONE": "x"})
    state = given(ModelDeclared(model="llama", spec=before))
    now = replace(LLAMA, env={"HF_ENDPOINT": "hf_newsecret", "DEBUG": "0", "NEW": "y"})

    second = declared(model_ops.apply_model(state, now))

    assert second.revision == 2
    assert second.changes == (
        SpecChange(field="env.GONE", old=WITHHELD, new=None),
        SpecChange(field="env.HF_ENDPOINT", old=WITHHELD, new=WITHHELD),
        SpecChange(field="env.NEW", old=None, new=WITHHELD),
    )
    said = describe(second)
    assert said == "model llama revision 2: env: added NEW; changed HF_ENDPOINT; removed GONE"
    written = msgspec.json.encode(second.changes) + said.encode()
    assert b"secret" not in written
    assert b'"x"' not in written
    assert b'"y"' not in written


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("command", "sglang serve {model} --port {port}"),
        ("engine", "sglang"),
        ("env", {"CUDA_LAUNCH_BLOCKING": "1"}),
        ("gpus_per_shard", 2),
        ("gpu_memory_gib", 70.0),
        ("shards_per_replica", 2),
        ("node_selector", {"gpu": "h100"}),
    ],
)
def test_every_field_that_changes_what_runs_makes_a_revision(field: str, value: object) -> None:
    state = given(ModelDeclared(model="llama", spec=LLAMA))

    second = declared(model_ops.apply_model(state, replace(LLAMA, **{field: value})))

    assert second.revision == 2
    assert [c.field.split(".")[0] for c in second.changes] == [field]


def test_the_fields_that_make_a_revision_are_those_the_stories_cover() -> None:
    covered = test_every_field_that_changes_what_runs_makes_a_revision.pytestmark[0].args[1]
    assert {field for field, _ in covered} == set(REVISION_FIELDS)


@pytest.mark.parametrize(
    "changed",
    [
        replace(LLAMA, routing=RoutingSettings(weight=3.0, target_waiting=8)),
        replace(LLAMA, replicas=5),
        replace(LLAMA, startup_timeout_s=1200.0, stop_grace_s=5.0, max_moves=2),
    ],
    ids=["routing", "replica count", "timers and pace"],
)
def test_a_change_that_does_not_change_what_runs_takes_effect_at_once_as_the_same_revision(
    changed: ModelSpec,
) -> None:
    state = given(ModelDeclared(model="llama", spec=LLAMA))

    event = declared(model_ops.apply_model(state, changed))
    now = after(state, Change(stream="model-llama", events=(event,)))

    assert (event.revision, event.changes) == (1, ())
    assert now.models["llama"].spec == changed  # at once, for every replica
    assert now.models["llama"].revision == 1


def test_scaling_and_tuning_are_no_revisions() -> None:
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        ModelScaled(model="llama", replicas=4, previous=2),
        ModelTuned(model="llama", weight=2.0, target_waiting=9, kv_ceiling=0.7),
    )

    assert state.models["llama"].revision == 1
    assert model_ops.scale(state, "llama", 6).events == (
        ModelScaled(model="llama", replicas=6, previous=4),
    )


def test_re_applying_the_spec_of_the_current_revision_records_nothing() -> None:
    upgraded = replace(LLAMA, gpus_per_shard=2)
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        ModelDeclared(model="llama", spec=upgraded, revision=2),
    )

    assert model_ops.apply_model(state, upgraded).events == ()


def test_a_removed_model_declared_again_continues_its_count_of_revisions() -> None:
    upgraded = replace(LLAMA, engine="sglang")
    state = given(
        ModelDeclared(model="llama", spec=LLAMA),
        ModelDeclared(model="llama", spec=upgraded, revision=2),
        ModelRemoved(model="llama"),
    )

    same = declared(model_ops.apply_model(state, upgraded), removed=True)
    other = declared(model_ops.apply_model(state, LLAMA), removed=True)

    assert (same.revision, same.changes) == (2, ())
    assert other.revision == 3
    assert other.changes == (SpecChange(field="engine", old="sglang", new="vllm"),)


def test_replicas_placed_after_a_revision_carry_it_and_those_before_keep_theirs() -> None:
    cluster = with_two_nodes_and_a_model(replicas=2)
    first = of_type(cluster.reconcile(), ReplicaPlaced)
    for replica in first:
        cluster.serve(replica.replica_id)
    spec = cluster.state.models["llama"].spec
    revised = declared(
        model_ops.apply_model(
            cluster.state, replace(spec, command=spec.command + " --fast", replicas=3)
        )
    )
    cluster.given(revised)

    later = of_type(cluster.reconcile(), ReplicaPlaced)

    assert [(p.replica_id, p.revision) for p in first] == [("llama-1", 1), ("llama-2", 1)]
    assert [(p.replica_id, p.revision) for p in later] == [("llama-3", 2)]
    replicas = cluster.state.replicas
    assert [replicas[i].revision for i in ("llama-1", "llama-2", "llama-3")] == [1, 1, 2]
    status = model_status(cluster.state, "llama", cluster.now)
    assert status.model.revision == 2
    assert status.outdated == ("llama-1", "llama-2")
    assert describe(later[0]).endswith(", revision 2")


def test_events_written_before_revisions_read_as_revision_1() -> None:
    old_declared = msgspec.json.encode(
        {"type": "model_declared", "model": "llama", "spec": msgspec.to_builtins(LLAMA)}
    )
    old_placed = msgspec.json.encode(
        {
            "type": "replica_placed",
            "replica_id": "llama-1",
            "model": "llama",
            "number": 1,
            "shards": [{"index": 0, "node_id": "gpu-1", "gpus": [0], "port": 20001}],
        }
    )

    model_event = decode_event(1, "model_declared", 1, old_declared)
    replica_event = decode_event(2, "replica_placed", 1, old_placed)
    state = replay(log(model_event, replica_event))

    assert isinstance(model_event, ModelDeclared)
    assert isinstance(replica_event, ReplicaPlaced)
    assert (model_event.revision, model_event.changes, replica_event.revision) == (1, (), 1)
    assert (state.models["llama"].revision, state.replicas["llama-1"].revision) == (1, 1)
    assert model_status(state, "llama", state.models["llama"].declared_at).outdated == ()
    # The first change after an upgrade is revision 2.
    upgraded = declared(model_ops.apply_model(state, replace(LLAMA, gpus_per_shard=2)))
    assert upgraded.revision == 2


def test_changes_in_one_line_shorten_long_values() -> None:
    long = "x" * 100
    said = describe_changes((SpecChange(field="command", old="a", new=long),))

    assert said == f"command a -> {'x' * 45}..."


def test_two_long_values_alike_at_their_start_show_where_they_differ() -> None:
    """A real engine's command is longer than a line shows: cut at the same place, both
    would read the same and hide the change (``rollout history``, ``history model``)."""
    command = "vllm serve meta-llama/Llama-3.1-70B-Instruct --port {port} --max-model-len"
    change = SpecChange(field="command", old=f"{command} 8192", new=f"{command} 16384")

    said = describe_changes((change,))

    assert said == "command '...--max-model-len 8192' -> '...--max-model-len 16384'"


def test_a_replica_of_an_earlier_revision_starts_again_with_its_own_spec() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1, env={"MODE": "old"})
    cluster.reconcile()
    cluster.serve("llama-1")
    spec = cluster.state.models["llama"].spec
    fast = replace(spec, command=spec.command + " --fast", env={"MODE": "new"}, replicas=2)
    cluster.given(declared(model_ops.apply_model(cluster.state, fast)))
    node = cluster.state.replicas["llama-1"].shards[0].node_id
    cluster.given(
        ShardStopped(
            replica_id="llama-1", shard_index=0, node_id=node, reason="agent shutting down"
        )
    )
    cluster.reports[node] = NodeReport(node_id=node)  # its engine is gone

    decision = cluster.reconcile()

    starts = {c.command.replica_id: c.command for c in decision.commands}
    assert set(starts) == {"llama-1", "llama-2"}
    old, new = starts["llama-1"], starts["llama-2"]
    assert isinstance(old, StartShard)
    assert isinstance(new, StartShard)
    assert ("--fast" in old.argv, old.env) == (False, {"MODE": "old"})
    assert ("--fast" in new.argv, new.env) == (True, {"MODE": "new"})


def test_an_earlier_spec_is_kept_while_a_replica_runs_it_and_dropped_after() -> None:
    cluster = with_two_nodes_and_a_model(replicas=1)
    cluster.reconcile()
    first = cluster.state.models["llama"].spec
    second = replace(first, gpus_per_shard=2)
    cluster.given(declared(model_ops.apply_model(cluster.state, second)))

    kept = cluster.state.models["llama"]
    cluster.given(ReplicaStopped(replica_id="llama-1"))
    cluster.given(declared(model_ops.apply_model(cluster.state, replace(second, replicas=3))))
    dropped = cluster.state.models["llama"]

    assert (kept.revision, kept.earlier_specs) == (2, {1: first})
    assert kept.spec_of(1) == first
    assert kept.spec_of(2) == second
    assert (dropped.revision, dropped.earlier_specs) == (2, {})
