"""The routes a gateway holds after a read: a read of every route replaces them, a read of
changes replaces the routes of every replica, node and model it names."""

from __future__ import annotations

import pytest

from app.gateway.held_routes import HeldRoutes, routes_after
from app.store.routing_rows import RouteChanges, RouteRow, RoutingRows


def route(replica_id: str, node_id: str, *, weight: float = 1.0) -> RouteRow:
    return RouteRow(
        replica_id=replica_id,
        model=replica_id.rsplit("-", 1)[0],
        address="10.0.0.1",
        port=20000,
        weight=weight,
        target_waiting=4,
        kv_ceiling=0.9,
        draining=False,
        node_id=node_id,
    )


def read(position: int, routes: list[RouteRow], changed: RouteChanges | None) -> RoutingRows:
    return RoutingRows(
        position=position,
        declared=[],
        created={},
        canaries=[],
        cold_starts=[],
        start_failures=[],
        scaled_to_zero=[],
        starting={},
        policies=[],
        routes=routes,
        apis=[],
        keys=[],
        changed=changed,
    )


HELD = HeldRoutes(
    7,
    {
        "llama-1": route("llama-1", "gpu-1"),
        "llama-2": route("llama-2", "gpu-2"),
        "qwen-1": route("qwen-1", "gpu-1"),
        "qwen-2": route("qwen-2", "gpu-3"),
    },
)


def test_a_read_of_every_route_replaces_what_is_held() -> None:
    after = routes_after(HELD, read(9, [route("llama-3", "gpu-2")], None))

    assert after == HeldRoutes(9, {"llama-3": route("llama-3", "gpu-2")})


@pytest.mark.parametrize(
    ("changed", "left"),
    [
        (RouteChanges(replicas=["llama-2"], nodes=[], models=[]), {"llama-1", "qwen-1", "qwen-2"}),
        (RouteChanges(replicas=[], nodes=["gpu-1"], models=[]), {"llama-2", "qwen-2"}),
        (RouteChanges(replicas=[], nodes=[], models=["qwen"]), {"llama-1", "llama-2"}),
        (RouteChanges(replicas=[], nodes=[], models=[]), set(HELD.rows)),
    ],
)
def test_the_routes_a_read_of_changes_names_and_did_not_read_are_gone(
    changed: RouteChanges, left: set[str]
) -> None:
    after = routes_after(HELD, read(8, [], changed))

    assert after.position == 8
    assert set(after.rows) == left


def test_the_routes_a_read_of_changes_read_replace_those_held_and_join_them() -> None:
    changed = RouteChanges(replicas=["llama-1", "llama-4"], nodes=[], models=[])
    again = route("llama-1", "gpu-1", weight=3.0)

    after = routes_after(HELD, read(8, [again, route("llama-4", "gpu-3")], changed))

    assert after.rows["llama-1"] == again
    assert after.rows["llama-4"] == route("llama-4", "gpu-3")
    assert after.rows["qwen-2"] is HELD.rows["qwen-2"]


def test_changes_with_nothing_held_are_refused() -> None:
    with pytest.raises(ValueError, match="none are"):
        routes_after(None, read(8, [], RouteChanges(replicas=[], nodes=[], models=[])))
