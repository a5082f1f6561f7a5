"""A gateway that served more replicas in its window than a report lists: the report keeps
the busiest and names the models heard among the rest, within its bounds; a reader counts a
named model's unlisted replicas as heard, and a rollout does not judge on figures that may
lack them."""

from __future__ import annotations

import msgspec
import pytest

from app.domain.autoscale_heard import heard_within
from app.domain.events import replica_id_for
from app.domain.model_spec import RolloutPolicy
from app.domain.rollout_verdict import INCONCLUSIVE, PROMOTE, judge
from app.domain.shard_report_budget import MAX_REPLICA_NUMBER
from app.domain.traffic import ReplicaTraffic, merge
from app.domain.traffic_left_out import (
    MAX_MODELS_NAMED,
    GatewayTraffic,
    LeftOut,
    figures_of_groups,
    leaving_out,
    model_of_replica,
)
from app.store.gateway_reports import MAX_REPORTED_REPLICAS, TrafficReport, bounded

BUSY = ReplicaTraffic(requests=50)
ONCE = ReplicaTraffic(requests=1)


def crowded_window() -> dict[str, ReplicaTraffic]:
    """A gateway's window past the cap: ``MAX_REPORTED_REPLICAS`` busy replicas of one
    model, and one request each to ``quiet``'s replica and a cancel to ``shy``'s."""
    replicas = {f"busy-{n}": BUSY for n in range(MAX_REPORTED_REPLICAS)}
    replicas["quiet-1"] = ONCE
    replicas["shy-7"] = ReplicaTraffic(cancelled=1)
    return replicas


def test_a_report_past_the_cap_names_the_models_heard_among_the_replicas_it_leaves_out() -> None:
    report = bounded(TrafficReport(window_s=60.0, replicas=crowded_window()))

    assert len(report.replicas) == MAX_REPORTED_REPLICAS
    assert "quiet-1" not in report.replicas
    assert report.left_out == LeftOut(replicas=2, models=frozenset({"quiet", "shy"}))
    encoded = msgspec.json.encode(report)
    assert msgspec.json.decode(encoded, type=TrafficReport) == report


def test_a_report_within_the_cap_is_written_as_before() -> None:
    report = TrafficReport(window_s=60.0, replicas={"quiet-1": ONCE})

    assert bounded(report) is report
    assert set(msgspec.json.decode(msgspec.json.encode(report))) == {"window_s", "replicas"}


def test_a_report_names_a_bounded_number_of_models_and_says_when_it_could_not_name_them_all() -> (
    None
):
    many = [f"m{n:05}-1" for n in range(MAX_MODELS_NAMED + 5)]

    named = leaving_out(many, many)
    odd = leaving_out(["no_model_named"], ["no_model_named"])

    assert len(named.models) == MAX_MODELS_NAMED
    assert named.unnamed_models
    assert named.replicas == MAX_MODELS_NAMED + 5
    assert odd == LeftOut(replicas=1, models=frozenset(), unnamed_models=True)


def test_replicas_left_out_without_a_request_name_no_model() -> None:
    replicas = {f"busy-{n}": BUSY for n in range(3)} | {"idle-1": ReplicaTraffic()}

    report = bounded(TrafficReport(window_s=60.0, replicas=replicas), most=3)

    assert report.left_out == LeftOut(replicas=1, models=frozenset())


@pytest.mark.parametrize(
    "hostile",
    [
        b'{"replicas":1,"models":["Not A Name"]}',
        b'{"replicas":-1,"models":[]}',
        b'{"replicas":1,"models":[],"surprise":true}',
        b'{"replicas":1,"models":"quiet"}',
        msgspec.json.encode(
            {"replicas": 1, "models": [f"m{n}" for n in range(MAX_MODELS_NAMED + 1)]}
        ),
    ],
)
def test_what_a_report_says_it_left_out_is_read_into_bounded_types(hostile: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(hostile, type=LeftOut)


def gateway(listed: dict[str, ReplicaTraffic], left_out: LeftOut | None) -> GatewayTraffic:
    return GatewayTraffic(window_s=60.0, parts=listed, left_out=left_out)


def test_a_model_a_report_left_out_is_heard_within_that_gateways_window() -> None:
    cut = bounded(TrafficReport(window_s=60.0, replicas=crowded_window()))
    groups = {"quiet": ["quiet-1", "quiet-2"], "shy": ["shy-7"], "busy": ["busy-1"]}
    wanted = {m for members in groups.values() for m in members}
    listed = {replica: seen for replica, seen in cut.replicas.items() if replica in wanted}

    figures = figures_of_groups(groups, [gateway(listed, cut.left_out)])

    assert figures["quiet"].requests == 0
    assert figures["quiet"].unlisted == 1
    assert figures["busy"].unlisted == 0
    assert heard_within(figures) == {"quiet": 60.0, "shy": 60.0, "busy": 60.0}


def test_a_model_no_report_names_nor_lists_is_not_heard() -> None:
    left_out = LeftOut(replicas=1, models=frozenset({"other"}))
    older_gateway = None

    figures = figures_of_groups(
        {"quiet": ["quiet-1"]}, [gateway({}, left_out), gateway({}, older_gateway)]
    )

    assert figures["quiet"].gateways == 2
    assert figures["quiet"].unlisted == 0
    assert heard_within(figures) == {}


def test_a_gateway_that_could_not_name_every_model_may_have_left_out_any() -> None:
    left_out = LeftOut(replicas=3000, models=frozenset(), unnamed_models=True)

    figures = figures_of_groups({"quiet": ["quiet-1"]}, [gateway({}, left_out)])

    assert figures["quiet"].unlisted == 1


def test_a_verdict_waits_rather_than_judge_figures_a_report_may_have_left_out() -> None:
    seen = merge([(60.0, ReplicaTraffic(requests=500))])
    assert seen is not None
    policy = RolloutPolicy()
    assert judge(seen, seen, policy)[0] == PROMOTE

    partial = msgspec.structs.replace(seen, unlisted=1)
    verdict, reason = judge(partial, seen, policy)

    assert verdict == INCONCLUSIVE
    assert reason == (
        "1 gateway(s) may have left replicas of the new revision out of their reports "
        "(past the replicas a report lists): the figures may lack their requests"
    )


@pytest.mark.parametrize("model", ["a", "llama-3", "qwen2.5-7b-instruct", "m-1", "x" * 63])
@pytest.mark.parametrize("number", [1, 12, MAX_REPLICA_NUMBER])
def test_every_replica_id_names_its_model(model: str, number: int) -> None:
    # Every replica, a drain's replacement and a rollout's new revision included, is
    # placed under replica_id_for's id (desired_count._place_at): a model ending in "-<n>"
    # or holding a "-" is still told apart from the replica's number.
    assert model_of_replica(replica_id_for(model, number)) == model
