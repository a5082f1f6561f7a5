"""The route rows a gateway holds, and the next read's changes applied to them.

Reading every route on every change of the projection costs the database a share of a core
per gateway at 20,000 replicas (docs/performance.md, "The routing snapshot read as the
fleet grows"), nearly all of it routes that did not change. So after its first read a
gateway reads only the routes the events since its position may have changed
(``app.store.routing_rows.RouteChanges``) and applies them here: every held route of a
replica the read read again is dropped, and the routes it returned put back. A read of
every route replaces what is held.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from app.store.routing_rows import RouteRow, RoutingRows


class HeldRoutes(msgspec.Struct, frozen=True):
    """The route rows of a gateway's snapshot, by replica, as of the projection's
    ``position``: what the next read's changes apply to."""

    position: int
    rows: Mapping[str, RouteRow]


def routes_after(held: HeldRoutes | None, read: RoutingRows) -> HeldRoutes:
    """The routes after ``read``: all it read, for a read of every route; otherwise
    ``held`` with the routes of the replicas it read again replaced by those it returned."""
    changed = read.changed
    if changed is None:
        return HeldRoutes(read.position, {row.replica_id: row for row in read.routes})
    if held is None:
        raise ValueError("a read of changes applies to routes held; none are")
    read_again = set(changed.replicas)
    rows = {k: row for k, row in held.rows.items() if k not in read_again}
    rows.update((row.replica_id, row) for row in read.routes)
    return HeldRoutes(read.position, rows)
