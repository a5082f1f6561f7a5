"""The routes a gateway holds after a read: a read of every route replaces them, a read of
changes replaces the routes of the replicas it read again."""

from __future__ import annotations

import pytest

from app.gateway.held_routes import HeldRoutes, routes_after
from app.store.routing_rows import RouteChanges, RouteRow, RoutingRows
from tests.support.route_rows import route_row


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
        "llama-1": route_row("llama-1"),
        "llama-2": route_row("llama-2"),
        "qwen-1": route_row("qwen-1"),
        "qwen-2": route_row("qwen-2"),
    },
)


def test_a_read_of_every_route_replaces_what_is_held() -> None:
    after = routes_after(HELD, read(9, [route_row("llama-3")], None))

    assert after == HeldRoutes(9, {"llama-3": route_row("llama-3")})


def test_the_routes_of_replicas_read_again_and_not_returned_are_gone() -> None:
    after = routes_after(HELD, read(8, [], RouteChanges(replicas=["llama-2", "qwen-1"])))

    assert after.position == 8
    assert after.rows == {k: HELD.rows[k] for k in ("llama-1", "qwen-2")}


def test_a_read_of_no_change_keeps_every_route_held() -> None:
    after = routes_after(HELD, read(8, [], RouteChanges(replicas=[])))

    assert after == HeldRoutes(8, HELD.rows)


def test_the_routes_a_read_of_changes_read_replace_those_held_and_join_them() -> None:
    changed = RouteChanges(replicas=["llama-1", "llama-4"])
    again = route_row("llama-1", weight=3.0)

    after = routes_after(HELD, read(8, [again, route_row("llama-4")], changed))

    assert after.rows["llama-1"] == again
    assert after.rows["llama-4"] == route_row("llama-4")
    assert after.rows["qwen-2"] is HELD.rows["qwen-2"]


def test_changes_with_nothing_held_are_refused() -> None:
    with pytest.raises(ValueError, match="none are"):
        routes_after(None, read(8, [], RouteChanges(replicas=[])))
