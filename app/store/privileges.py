"""Whether the role a server connects as could rewrite the event log around its guards.

``serve`` and ``gateway`` refuse such a role unless told otherwise. A role is privileged
when it is a superuser, owns a table or function of llmgw or is a member of the role that
does (``ALTER TABLE events DISABLE TRIGGER``, ``CREATE OR REPLACE FUNCTION llmgw_append``),
can set ``session_replication_role`` (which silences triggers; tried, then rolled back, since
managed PostgreSQL services grant it in ways of their own), may write the log's tables
directly, may create objects in llmgw's schema (``llmgw_append`` runs as the owner and looks
up what it calls there: a closer match for one of those calls, put there by this role, would
run as the owner), has CREATEROLE (it could make itself a member of the owner) or BYPASSRLS.
"""

from __future__ import annotations

import asyncpg

from app.store.database import driver_url
from app.store.grants import (
    APPEND_FUNCTION,
    RUNTIME_FUNCTIONS,
    SNAPSHOT_TABLES,
    TELEMETRY_TABLES,
    creates_in_schema,
)
from app.store.tables import metadata

CONNECT_TIMEOUT_S = 10.0
WRITE_PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "TRIGGER")
LOG_TABLES = tuple(
    sorted(
        table.name
        for table in metadata.sorted_tables
        if table.name not in TELEMETRY_TABLES and table.name not in SNAPSHOT_TABLES
    )
)
"""Tables the runtime role may read but not write: the log, its projections, checkpoints
and leadership (not the gateways' reports, nor the fold snapshots derived from the log)."""

_ROLE = """
SELECT current_user AS role, rolsuper, rolcreaterole, rolbypassrls
FROM pg_roles WHERE rolname = current_user
"""
_OWNED = """
SELECT kind, name, pg_get_userbyid(owner) AS owner, owner = r.oid AS own
FROM (SELECT 'table' AS kind, c.relname::text AS name, c.relowner AS owner
      FROM unnest($1::text[]) AS t(name) JOIN pg_class c ON c.oid = to_regclass(t.name)
      UNION ALL
      SELECT 'function', p.proname::text, p.proowner
      FROM unnest($2::text[]) AS f(name) JOIN pg_proc p ON p.oid = to_regproc(f.name)) o,
     pg_roles r
WHERE r.rolname = current_user AND pg_has_role(current_user, o.owner, 'MEMBER')
ORDER BY o.name = 'events' DESC, kind DESC, name
LIMIT 1
"""
_MAY_APPEND = """
SELECT coalesce(bool_or(has_function_privilege(p.oid, 'EXECUTE')), false) FROM pg_proc p
WHERE p.proname = $1 AND p.pronamespace = to_regnamespace(current_schema())
"""
_CREATES_IN_SCHEMA = """
SELECT current_schema() WHERE has_schema_privilege(current_schema(), 'CREATE')
"""
_WRITABLE = """
SELECT t.name, p.privilege
FROM unnest($1::text[]) AS t(name), unnest($2::text[]) AS p(privilege)
WHERE to_regclass(t.name) IS NOT NULL
  AND (has_table_privilege(t.name, p.privilege)
       OR (p.privilege IN ('INSERT', 'UPDATE') AND has_any_column_privilege(t.name, p.privilege)))
ORDER BY t.name = 'events' DESC, t.name
LIMIT 1
"""


async def privileged_role(database_url: str) -> tuple[str, str | None]:
    """The role ``database_url`` connects as, and why it could rewrite the log (None when
    it could not). Connection failures raise as asyncpg raises them."""
    db = await asyncpg.connect(driver_url(database_url), timeout=CONNECT_TIMEOUT_S)
    try:
        return await _privileged_role(db)
    finally:
        await db.close()


async def may_append(database_url: str) -> bool:
    """Whether the role ``database_url`` connects as may execute ``llmgw_append``: a
    runtime role may, a gateway role (which a gateway needs) may not. Connection failures
    raise as asyncpg raises them."""
    db = await asyncpg.connect(driver_url(database_url), timeout=CONNECT_TIMEOUT_S)
    try:
        return bool(await db.fetchval(_MAY_APPEND, APPEND_FUNCTION))
    finally:
        await db.close()


async def _privileged_role(db: asyncpg.Connection) -> tuple[str, str | None]:
    role = await db.fetchrow(_ROLE)
    name = role["role"]
    if role["rolsuper"]:
        return name, "is a superuser"
    owned = await db.fetchrow(_OWNED, list(LOG_TABLES), list(RUNTIME_FUNCTIONS))
    if owned is not None:
        what = f"{owned['kind']} {owned['name']}"
        if owned["own"]:
            return name, f"owns {what}"
        return name, f'is a member of "{owned["owner"]}", which owns {what}'
    if await _can_silence_triggers(db):
        return name, "may set session_replication_role, which turns the log's triggers off"
    writable = await db.fetchrow(_WRITABLE, list(LOG_TABLES), list(WRITE_PRIVILEGES))
    if writable is not None:
        return name, f"may {writable['privilege']} {writable['name']} directly"
    schema = await db.fetchval(_CREATES_IN_SCHEMA)
    if schema is not None:
        return name, creates_in_schema(schema)
    if role["rolcreaterole"]:
        return name, "has CREATEROLE, so it could make itself a member of the owner"
    if role["rolbypassrls"]:
        return name, "has BYPASSRLS"
    return name, None


async def _can_silence_triggers(db: asyncpg.Connection) -> bool:
    transaction = db.transaction()
    await transaction.start()
    try:
        await db.execute("SET LOCAL session_replication_role = replica")
    except asyncpg.InsufficientPrivilegeError:
        return False
    finally:
        await transaction.rollback()
    return True
