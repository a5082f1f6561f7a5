"""A crowded gateway's report keeps the replicas of models in a canary step first, then the
busiest of the rest, within the same cap: a canary's quiet replicas are listed, so its
rollout's verdict reads them whole. A report within the cap is left as it was."""

from __future__ import annotations

import msgspec

from app.domain.traffic import ReplicaTraffic
from app.domain.traffic_cut import in_canary_step, kept_and_left
from app.store.gateway_reports import TrafficReport, bounded

BUSY = ReplicaTraffic(requests=50)
ONCE = ReplicaTraffic(requests=1)
IDLE = ReplicaTraffic()


def test_a_canary_models_replicas_are_kept_first_even_idle_then_the_busiest_of_the_rest() -> None:
    replicas = {
        "busy-1": BUSY,
        "canary-1": ONCE,
        "quiet-1": ONCE,
        "busy-2": ReplicaTraffic(requests=20),
        "canary-2": IDLE,
        "busy-3": ReplicaTraffic(requests=10),
    }

    kept, left = kept_and_left(replicas, 4, first={"canary-1", "canary-2"})

    assert {replica for replica, _ in kept} == {"canary-1", "canary-2", "busy-1", "busy-2"}
    assert [replica for replica, _ in left] == ["quiet-1", "busy-3"]


def test_canary_replicas_past_the_cap_keep_the_busiest_of_them_and_name_the_model() -> None:
    replicas = {"canary-1": ONCE, "canary-2": BUSY, "canary-3": IDLE, "busy-1": BUSY}

    report = bounded(
        TrafficReport(window_s=60, replicas=replicas),
        2,
        first={"canary-1", "canary-2", "canary-3"},
    )

    assert set(report.replicas) == {"canary-1", "canary-2"}
    assert report.left_out is not None
    assert report.left_out.replicas == 2
    assert report.left_out.models == {"busy"}


def test_without_canaries_a_cut_report_keeps_the_busiest_as_before() -> None:
    replicas = {"quiet-1": ONCE, "busy-1": BUSY, "shy-1": ReplicaTraffic(cancelled=2)}

    kept, left = kept_and_left(replicas, 2)

    assert kept == [("shy-1", replicas["shy-1"]), ("busy-1", BUSY)]
    assert left == [("quiet-1", ONCE)]


def test_a_report_within_the_cap_is_written_as_it_was() -> None:
    replicas = {"quiet-1": ONCE, "canary-1": IDLE, "busy-1": BUSY}
    report = TrafficReport(window_s=60, replicas=replicas)

    kept, left = kept_and_left(replicas, 3, first={"canary-1"})
    same = bounded(report, 3, first={"canary-1"})

    assert dict(kept) == replicas
    assert left == []
    assert same is report
    assert msgspec.json.encode(same) == msgspec.json.encode(report)


def test_a_replicas_model_is_the_one_it_is_routed_for_else_the_one_its_id_names() -> None:
    routed = {"canary-1": "canary", "odd-name": "canary", "canary-9": "other"}
    seen = ["canary-1", "odd-name", "canary-9", "canary-2", "other-1", "nameless"]

    first = in_canary_step(seen, {"canary"}, routed)

    # canary-2 is routed no more (drained, say) but its id names the model.
    assert first == {"canary-1", "odd-name", "canary-2"}
