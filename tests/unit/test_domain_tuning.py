"""Stories of applying bench results: given the log, when settings are applied to a model or
a replica, then one ``ModelTuned`` is recorded and the fold routes by it, or the request is
refused with every field and reason, or nothing is recorded because nothing changes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    ModelRemoved,
    ModelTuned,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStopped,
    ShardPlacement,
    model_stream,
)
from app.domain.evolve import replay
from app.domain.model_operations import apply_model
from app.domain.model_spec import ModelSpec, RoutingSettings
from app.domain.operation_results import Change, InvalidOperation, UnknownModel
from app.domain.state import ClusterState
from app.domain.tuning import MAX_SUMMARY_BYTES, InvalidTuning, tune

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
LLAMA = ModelSpec(name="llama", command="vllm serve {model} --port {port}", replicas=2)
QWEN = ModelSpec(name="qwen", command="vllm serve {model} --port {port}")
MEASURED = RoutingSettings(weight=2.5, target_waiting=12, kv_ceiling=0.9)
SUMMARY = {"capacity_concurrency": 24, "p95_ttft_s": 0.41}


def recorded(events: tuple[AnyEvent, ...], start: int = 1) -> list[Recorded]:
    return [
        Recorded(
            position=n,
            stream="any",
            version=n,
            event_id=uuid.uuid4(),
            recorded_at=T0 + timedelta(seconds=n),
            meta=Meta(actor="alice"),
            event=event,
        )
        for n, event in enumerate(events, start=start)
    ]


def given(*events: AnyEvent) -> ClusterState:
    return replay(recorded(events))


def after(state: ClusterState, change: Change) -> ClusterState:
    return replay(recorded(change.events, start=state.position + 1), state)


def placed(replica_id: str) -> ReplicaPlaced:
    model, number = replica_id.rsplit("-", 1)
    shard = ShardPlacement(index=0, node_id="gpu-1", gpus=(0,), port=20000)
    return ReplicaPlaced(replica_id=replica_id, model=model, number=int(number), shards=(shard,))


def cluster() -> ClusterState:
    return given(
        ModelDeclared(model="llama", spec=LLAMA),
        ModelDeclared(model="qwen", spec=QWEN),
        placed("llama-1"),
        ReplicaServing(replica_id="llama-1"),
        placed("llama-2"),
        placed("qwen-1"),
        placed("llama-3"),
        ReplicaStopped(replica_id="llama-3"),
    )


def test_tuning_a_model_records_the_settings_and_its_replicas_route_by_them() -> None:
    state = cluster()

    change = tune(state, "llama", None, MEASURED, SUMMARY)

    assert change.stream == model_stream("llama")
    assert change.events == (
        ModelTuned(
            model="llama",
            replica_id=None,
            weight=2.5,
            target_waiting=12,
            kv_ceiling=0.9,
            summary=SUMMARY,
        ),
    )
    tuned = after(state, change)
    assert tuned.models["llama"].spec.routing == MEASURED
    assert tuned.models["llama"].tuned_summary == SUMMARY
    assert tuned.replicas["llama-1"].routing is None  # it follows the model's


def test_tuning_one_replica_leaves_the_model_and_its_other_replicas_alone() -> None:
    state = cluster()

    tuned = after(state, tune(state, "llama", "llama-2", MEASURED, SUMMARY))

    assert tuned.replicas["llama-2"].routing == MEASURED
    assert tuned.replicas["llama-1"].routing is None
    assert tuned.models["llama"].spec.routing == RoutingSettings()


def test_settings_already_in_force_record_nothing() -> None:
    state = cluster()
    tuned = after(state, tune(state, "llama", "llama-2", MEASURED, SUMMARY))

    assert tune(tuned, "llama", "llama-2", MEASURED, {}).events == ()
    assert tune(state, "llama", None, RoutingSettings(), {}).events == ()


@pytest.mark.parametrize(
    ("routing", "field", "reason"),
    [
        (RoutingSettings(weight=0), "weight", "must be between 0.001 and 1000000"),
        (RoutingSettings(weight=float("inf")), "weight", "must be between 0.001 and 1000000"),
        (RoutingSettings(weight=float("nan")), "weight", "must be between 0.001 and 1000000"),
        (RoutingSettings(target_waiting=0), "target_waiting", "must be between 1 and 100000"),
        (RoutingSettings(target_waiting=2**40), "target_waiting", "must be between 1 and 100000"),
        (RoutingSettings(kv_ceiling=0), "kv_ceiling", "must be in (0, 1]"),
        (RoutingSettings(kv_ceiling=1.01), "kv_ceiling", "must be in (0, 1]"),
    ],
)
def test_settings_out_of_range_are_refused_naming_the_field(
    routing: RoutingSettings, field: str, reason: str
) -> None:
    with pytest.raises(InvalidTuning) as refused:
        tune(cluster(), "llama", None, routing, {})

    assert [(e.field, e.reason) for e in refused.value.errors] == [(field, reason)]
    assert "nothing was recorded" in str(refused.value)


def test_every_bad_field_is_named_at_once() -> None:
    bad = RoutingSettings(weight=-1, target_waiting=0, kv_ceiling=2)

    with pytest.raises(InvalidTuning) as refused:
        tune(cluster(), "llama", "qwen-1", bad, {})

    assert [e.field for e in refused.value.errors] == [
        "weight",
        "target_waiting",
        "kv_ceiling",
        "replica_id",
    ]


@pytest.mark.parametrize(
    ("replica_id", "reason"),
    [
        ("llama-9", "no replica 'llama-9' is known"),
        ("qwen-1", "is a replica of model 'qwen', not this one"),
        ("llama-3", "has ended (stopped)"),
    ],
)
def test_a_replica_must_be_an_active_replica_of_the_model(replica_id: str, reason: str) -> None:
    with pytest.raises(InvalidTuning) as refused:
        tune(cluster(), "llama", replica_id, MEASURED, {})

    assert [(e.field, e.reason) for e in refused.value.errors] == [("replica_id", reason)]


def test_a_summary_too_big_for_the_log_is_refused() -> None:
    with pytest.raises(InvalidTuning) as refused:
        tune(cluster(), "llama", None, MEASURED, {"blob": "x" * MAX_SUMMARY_BYTES})

    assert [(e.field, e.reason) for e in refused.value.errors] == [
        ("summary", f"must encode to at most {MAX_SUMMARY_BYTES} bytes")
    ]


def test_an_unknown_or_removed_model_cannot_be_tuned() -> None:
    with pytest.raises(UnknownModel):
        tune(cluster(), "mistral", None, MEASURED, {})
    removed = after(cluster(), Change(stream="", events=(ModelRemoved(model="qwen"),)))
    with pytest.raises(InvalidOperation, match="was removed"):
        tune(removed, "qwen", None, MEASURED, {})


@pytest.mark.parametrize("capacity", [1e-200, 0, 0.5, 100_001, 10**400, "16", True, None])
def test_a_bench_capacity_the_autoscaler_could_not_scale_by_is_refused(capacity: object) -> None:
    with pytest.raises(InvalidTuning) as refused:
        tune(cluster(), "llama", None, MEASURED, {**SUMMARY, "capacity": capacity})

    assert [(e.field, e.reason) for e in refused.value.errors] == [
        (
            "summary.capacity",
            "must be between 1 and 100000 (the concurrency bench measured a replica serving "
            "within its SLO), or absent",
        )
    ]


def test_every_number_a_summary_holds_must_be_finite() -> None:
    summary = {"capacity": 24, "at_capacity": {"ttft_p95_s": float("nan")}, "p95": [1.0, -1e999]}

    with pytest.raises(InvalidTuning) as refused:
        tune(cluster(), "llama", None, MEASURED, summary)

    assert [(e.field, e.reason) for e in refused.value.errors] == [
        ("summary.at_capacity.ttft_p95_s", "must be a finite number"),
        ("summary.p95[1]", "must be a finite number"),
    ]


@pytest.mark.parametrize("number", [2**53 + 1, -(2**64), 1e16, -1.2345678901234567e18, 1e23])
def test_a_summary_number_the_log_would_not_give_back_exactly_is_refused(number: float) -> None:
    summary = {"capacity": 24, "peak": {"tokens": number}, "edges": [2**53, -(2.0**53)]}

    with pytest.raises(InvalidTuning) as refused:
        tune(cluster(), "llama", None, MEASURED, summary)

    assert [(e.field, e.reason) for e in refused.value.errors] == [
        (
            "summary.peak.tokens",
            "must be between -9007199254740992 and 9007199254740992 (2**53), the numbers the "
            "log keeps exactly",
        )
    ]


def test_a_summary_as_bench_writes_it_is_recorded() -> None:
    summary = {**SUMMARY, "capacity": 24, "at_capacity": {"success_rate": 1.0}, "levels": 6}

    change = tune(cluster(), "llama", None, MEASURED, summary)

    assert after(cluster(), change).models["llama"].tuned_summary == summary


SGLANG = msgspec.structs.replace(LLAMA, command="sglang serve {model} --port {port}")
"""What runs changes: the next revision."""


def test_settings_measured_on_an_earlier_revision_are_not_applied_to_the_model() -> None:
    # Bench measured llama-1 (revision 1) while the model moved to revision 2: before, its
    # figures became the routing of every replica of revision 2, which it never measured.
    state = cluster()
    moved = after(state, apply_model(state, SGLANG))
    assert moved.models["llama"].revision == 2

    with pytest.raises(InvalidTuning) as refused:
        tune(moved, "llama", None, MEASURED, SUMMARY, revision=1)

    assert [(e.field, e.reason) for e in refused.value.errors] == [
        (
            "revision",
            "bench measured revision 1 of the model; it is at revision 2 now: bench a "
            "replica of revision 2",
        )
    ]
    assert tune(moved, "llama", None, MEASURED, SUMMARY, revision=2).events != ()


def test_settings_measured_before_the_model_was_removed_and_declared_anew_are_refused() -> None:
    removed = after(cluster(), Change(stream="", events=(ModelRemoved(model="llama"),)))
    declared_anew = after(removed, apply_model(removed, SGLANG))

    with pytest.raises(InvalidTuning) as refused:
        tune(declared_anew, "llama", None, MEASURED, SUMMARY, revision=1)

    assert [e.field for e in refused.value.errors] == ["revision"]


def test_a_replica_keeps_the_settings_measured_on_it_whatever_the_models_revision() -> None:
    state = cluster()
    moved = after(state, apply_model(state, SGLANG))

    tuned = after(moved, tune(moved, "llama", "llama-1", MEASURED, SUMMARY, revision=1))

    assert tuned.replicas["llama-1"].routing == MEASURED
