"""Route rows as a gateway reads them (``app.store.routing_rows.RouteRow``), for tests that
build routing tables without a database."""

from __future__ import annotations

from app.store.routing_rows import RouteRow


def route_row(
    replica_id: str,
    model: str | None = None,
    *,
    address: str = "127.0.0.1",
    weight: float = 1.0,
    revision: int = 1,
) -> RouteRow:
    """A routable replica's row: of ``model``, or of the model its id names
    (``<model>-<n>``)."""
    return RouteRow(
        replica_id=replica_id,
        model=model if model is not None else replica_id.rsplit("-", 1)[0],
        address=address,
        port=20000,
        weight=weight,
        target_waiting=4,
        kv_ceiling=0.9,
        draining=False,
        revision=revision,
    )
