"""What the admin API says of a replica's traffic: every figure the gateways' reports add
up to, ``abandoned`` and ``unlisted`` among them, as the merge gave it."""

from __future__ import annotations

import msgspec

from app.admin.replica_schemas import ReplicaTrafficView
from app.admin.traffic import traffic_view
from app.domain.traffic import ReplicaTraffic, TrafficFigures, merge
from app.domain.traffic_left_out import GatewayTraffic, LeftOut, figures_of_groups


def test_clients_that_gave_up_before_any_answer_are_shown_apart_from_the_other_cancels() -> None:
    hung = ReplicaTraffic(requests=4, errors=1, cancelled=7, abandoned=5)
    other_gateway = ReplicaTraffic(requests=2, cancelled=1, abandoned=1)
    figures = merge([(60.0, hung), (55.0, other_gateway), (60.0, None)])
    assert figures is not None

    shown = msgspec.json.decode(msgspec.json.encode(traffic_view(figures)))

    assert (shown["requests"], shown["errors"], shown["gateways"]) == (6, 1, 3)
    assert (shown["cancelled"], shown["abandoned"]) == (8, 6)


def test_the_view_leaves_out_no_figure_the_merge_gives() -> None:
    merged = set(TrafficFigures.__struct_fields__)

    assert merged - set(ReplicaTrafficView.__struct_fields__) == set()


def test_figures_a_crowded_report_may_lack_say_how_many_gateways_left_replicas_out() -> None:
    crowded = GatewayTraffic(
        60.0,
        {"busy-1": ReplicaTraffic(requests=9)},
        LeftOut(replicas=1, models=frozenset({"qwen"})),
    )
    listing_all = GatewayTraffic(60.0, {"qwen-1": ReplicaTraffic(requests=3)}, None)
    figures = figures_of_groups({"qwen": ["qwen-1"], "busy": ["busy-1"]}, [crowded, listing_all])

    shown = {
        group: msgspec.json.decode(msgspec.json.encode(traffic_view(f)))
        for group, f in figures.items()
    }

    assert (shown["qwen"]["requests"], shown["qwen"]["unlisted"]) == (3, 1)
    assert (shown["busy"]["requests"], shown["busy"]["unlisted"]) == (9, 0)
