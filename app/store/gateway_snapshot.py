"""What a gateway routes by, read from the projection in one statement.

Declared models (removed ones are not: they answer 404 like any unknown model), the
``routing_table`` view with the address each route's node connected from (the gateway's
egress check allows that address by default), live (not revoked) API keys and the
projection's position. One
statement sees one snapshot of the database, as a REPEATABLE READ transaction of several
would, in one round trip instead of six.
"""

from __future__ import annotations

from time import monotonic

import asyncpg
import msgspec

from app.gateway.table import GatewaySnapshot, KeyRecord, Route
from app.store.postgres import CHECKPOINT

_READ_SNAPSHOT = """
SELECT
  (SELECT position FROM projection_checkpoints WHERE name = $1) AS position,
  (SELECT coalesce(json_agg(name), '[]') FROM models WHERE NOT removed) AS declared,
  (SELECT coalesce(json_agg(r), '[]') FROM (
     SELECT t.replica_id, t.model, t.address, t.port, t.weight, t.target_waiting,
            t.kv_ceiling, t.draining, coalesce(n.remote_address, '') AS agent_address
     FROM routing_table t LEFT JOIN nodes n ON n.id = t.node_id) r) AS routes,
  (SELECT coalesce(json_agg(k), '[]') FROM (
     SELECT id, name, prefix, secret_hash, models, rpm, tpm
     FROM api_keys WHERE revoked_at IS NULL) k) AS keys
"""


class RouteRow(msgspec.Struct, frozen=True):
    replica_id: str
    model: str
    address: str
    port: int
    weight: float
    target_waiting: int
    kv_ceiling: float
    draining: bool
    agent_address: str = ""


class KeyRow(msgspec.Struct, frozen=True):
    id: str
    name: str
    prefix: str
    secret_hash: str
    models: list[str]
    rpm: int | None
    tpm: int | None


_declared_decoder = msgspec.json.Decoder(list[str])
_routes_decoder = msgspec.json.Decoder(list[RouteRow])
_keys_decoder = msgspec.json.Decoder(list[KeyRow])


async def read_snapshot(db: asyncpg.Connection, *, within_s: float) -> GatewaySnapshot:
    row = await db.fetchrow(_READ_SNAPSHOT, CHECKPOINT, timeout=within_s)
    assert row is not None  # a SELECT without FROM returns one row
    return build_snapshot(
        int(row["position"] or 0),
        _declared_decoder.decode(row["declared"]),
        _routes_decoder.decode(row["routes"]),
        _keys_decoder.decode(row["keys"]),
        monotonic(),
    )


def engine_url(address: str, port: int) -> str:
    """``http://address:port``, the address agents register with; IPv6 in brackets."""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"http://{host}:{port}"


def build_snapshot(
    position: int, declared: list[str], routes: list[RouteRow], keys: list[KeyRow], at: float
) -> GatewaySnapshot:
    by_model: dict[str, list[Route]] = {}
    for row in sorted(routes, key=lambda r: r.replica_id):
        by_model.setdefault(row.model, []).append(
            Route(
                replica_id=row.replica_id,
                model=row.model,
                url=engine_url(row.address, row.port),
                weight=row.weight,
                target_waiting=row.target_waiting,
                kv_ceiling=row.kv_ceiling,
                draining=row.draining,
                agent_address=row.agent_address,
            )
        )
    return GatewaySnapshot(
        declared=frozenset(declared),
        routes={model: tuple(replicas) for model, replicas in by_model.items()},
        keys={
            k.prefix: KeyRecord(
                key_id=k.id,
                name=k.name,
                prefix=k.prefix,
                secret_hash=k.secret_hash,
                models=frozenset(k.models),
                rpm=k.rpm,
                tpm=k.tpm,
            )
            for k in keys
        },
        position=position,
        loaded_at=at,
    )
