"""The route rows a gateway holds, and the next read's changes applied to them.

Reading every route on every change of the projection costs the database a share of a core
per gateway at 20,000 replicas (docs/performance.md, "The routing snapshot read as the
fleet grows"), nearly all of it routes that did not change. So after its first read a
gateway reads only the routes the events since its position may have changed
(``app.store.routing_rows.RouteChanges``) and applies them here: every held route of a
replica the read read again is dropped, and the routes it returned put back. A read of
every route replaces what is held.

The routes are held as the snapshot has them too, a tuple per model (``routes``): a read
builds new tuples only for the models whose routes it may have changed
(``replicas_read_again``), and every other model keeps its tuple, the same object. For a
read of changes those are the models of the replicas it read again; for a read of every
route (on a connection, every 30 s, after a rebuild), those of the rows that differ from
the ones held, so that the periodic read of every route does not stall a gateway's loop
for a fleet that did not change. What takes the snapshot in (``app.gateway.egress``,
``app.gateway.router``) passes over the models whose tuple it has seen, and a snapshot
costs what changed rather than the fleet (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from app.gateway.table import Route
from app.store.routing_rows import RouteRow, RoutingRows


class HeldRoutes(msgspec.Struct, frozen=True):
    """The route rows of a gateway's snapshot, by replica, as of the projection's
    ``position``: what the next read's changes apply to."""

    position: int
    rows: Mapping[str, RouteRow]
    routes: Mapping[str, tuple[Route, ...]] | None = None
    """``rows`` as the snapshot's routes, by model (``app.gateway.snapshot.routing_of``);
    ``None``: not built yet, and the next read builds them all."""


def routes_after(held: HeldRoutes | None, read: RoutingRows) -> HeldRoutes:
    """The routes after ``read``: all it read, for a read of every route; otherwise
    ``held`` with the routes of the replicas it read again replaced by those it returned."""
    changed = read.changed
    if changed is None:
        return HeldRoutes(read.position, {row.replica_id: row for row in read.routes})
    if held is None:
        raise ValueError("a read of changes applies to routes held; none are")
    rows = dict(held.rows)  # a copy, then a look-up per replica read again: not a walk
    for replica_id in changed.replicas:
        rows.pop(replica_id, None)
    rows.update((row.replica_id, row) for row in read.routes)
    return HeldRoutes(read.position, rows)


def replicas_read_again(held: HeldRoutes, after: HeldRoutes, read: RoutingRows) -> set[str]:
    """The replicas whose routes ``read`` took ``held`` to ``after`` may have changed: for a
    read of changes, every replica it read again; for a read of every route, every replica
    whose row is not the one held, or that it did not return."""
    if read.changed is not None:
        read_again = {row.replica_id for row in read.routes}
        read_again.update(read.changed.replicas)
        return read_again
    before = held.rows
    read_again = {r for r, row in after.rows.items() if before.get(r) != row}
    read_again.update(r for r in before if r not in after.rows)
    return read_again
