"""The runtime role, the database role ``llmgw-server serve`` connects as; and the gateway role.

The schema's owner runs the migrations; the runtime role owns nothing and gets exactly:

============================================  ================================================
privilege                                     why
============================================  ================================================
SELECT on every table and view of the schema  catching up with the log, history, ``/readyz``
                                              (``alembic_version``), the gateway's snapshot
                                              (``routing_table``, ``api_keys``, ...), the
                                              reconciler's in-flight sum, ``log verify``
EXECUTE on ``llmgw_append``                   every append; it runs as the owner, so events,
                                              projection rows and the checkpoint are written
                                              only through it
EXECUTE on ``llmgw_next_epoch``               a new leader's epoch bump, which only adds one
INSERT, UPDATE, DELETE on ``gateway_reports``  each gateway's report (in flight, traffic):
and ``rate_budgets``                          live telemetry, not part of the log; and the
                                              slices of keys' limits gateways lease
INSERT, DELETE on ``fold_snapshots`` and      the leader's snapshots of the fold (written
``fold_snapshot_chunks``                      whole, pruned, never updated): derived from the
                                              log, checked against its chain when read
CONNECT on the database, USAGE on the schema  only where PUBLIC does not have them already
============================================  ================================================

Advisory locks, LISTEN and NOTIFY need no privilege. Everything else it might hold on the
schema's relations (granted by hand, say) is revoked first, so the result is exactly this.

The **gateway role** (``llmgw-server migrate --gateway-role``), for standalone
``llmgw-server gateway`` processes, gets the same minus everything that writes the log or
what is derived from it: SELECT on every table and view, INSERT, UPDATE, DELETE on
``gateway_reports`` and ``rate_budgets``, CONNECT and USAGE; no EXECUTE on any function
(a gateway never appends, elects no leader and writes no snapshot), so it cannot write a
projection row or an event even through ``llmgw_append``. A role is one or the other:
one that may execute ``llmgw_append`` is a runtime role.

``grant_runtime_privileges`` is the one place that says it: migration 0005 calls it, and
``llmgw-server migrate`` calls it after every upgrade, for the role it is given and every
role that already holds these privileges, so a table a later migration adds is granted
without that migration doing anything; ``grant_gateway_privileges`` does the same for the
gateway roles (those that may write ``gateway_reports`` and not append). The functions
take a synchronous SQLAlchemy connection: the migrations' own, or ``run_sync`` of an async
one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from app.store.errors import RuntimeRoleError
from app.store.scram import scram_sha256_verifier

DEFAULT_RUNTIME_ROLE = "llmgw_runtime"
APPEND_FUNCTION = "llmgw_append"
RUNTIME_FUNCTIONS = (APPEND_FUNCTION, "llmgw_next_epoch")
TELEMETRY_TABLES = ("gateway_reports", "rate_budgets")
SNAPSHOT_TABLES = ("fold_snapshots", "fold_snapshot_chunks")
MAX_ROLE_NAME_BYTES = 63
DUPLICATE_OBJECT = "42710"
UNIQUE_VIOLATION = "23505"
INTERNAL_ERROR = "XX000"
CONCURRENT_UPDATE = "tuple concurrently updated"
PASSWORD_TRIES = 20


@dataclass(frozen=True)
class RuntimeRole:
    name: str
    password: str | None = field(default=None, repr=False)
    """Set (as a SCRAM-SHA-256 verifier computed here) when given; else left as it is."""


def check_role_name(name: str) -> None:
    if not name or len(name.encode()) > MAX_ROLE_NAME_BYTES:
        raise RuntimeRoleError(
            f"a role name has 1 to {MAX_ROLE_NAME_BYTES} bytes, not {len(name.encode())}"
        )
    if "\x00" in name or name.lower().startswith("pg_") or name.lower() == "public":
        raise RuntimeRoleError(f"{name!r} cannot be a role name (reserved or invalid)")


def check_roles(runtime: RuntimeRole | None, gateway: RuntimeRole | None) -> None:
    """Raise ``RuntimeRoleError`` for what no database could take: a name no role can have,
    or one role given as both (the gateway role must not append)."""
    for kind, role in (("runtime", runtime), ("gateway", gateway)):
        if role is not None:
            try:
                check_role_name(role.name)
            except RuntimeRoleError as exc:
                raise RuntimeRoleError(f"--{kind}-role: {exc}") from exc
    if runtime is not None and gateway is not None and runtime.name == gateway.name:
        raise RuntimeRoleError(
            f'"{gateway.name}" cannot be both the runtime and the gateway role: the gateway '
            "role must not append"
        )


def ensure_runtime_role(connection: Connection, role: RuntimeRole) -> bool:
    """Create ``role`` (LOGIN, nothing else) unless it exists, set its password when one is
    given, and refuse a role that could rewrite the log. True when it was created."""
    check_role_name(role.name)
    quoted = _quote(connection, role.name)
    exists = connection.execute(
        text("SELECT 1 FROM pg_roles WHERE rolname = :name"), {"name": role.name}
    ).scalar()
    created = False
    if not exists:
        _require_createrole(connection, role.name, "create")
        created = _create_role_unless_taken(connection, quoted)
    if role.password is not None:
        _require_createrole(connection, role.name, "set the password of")
        _set_password(connection, quoted, scram_sha256_verifier(role.password))
    refuse_privileged(connection, role.name)
    return created


def grant_runtime_privileges(connection: Connection, role: str | None = None) -> list[str]:
    """Give ``role`` (when given) and every role that already holds them the runtime
    privileges on this database; returns those roles, sorted."""
    roles = set(runtime_roles(connection))
    if role is not None:
        check_role_name(role)
        roles.add(role)
    if not roles:
        return []
    relations = _relations(connection)
    snapshots = [name for name, bare in relations.readable if bare in SNAPSHOT_TABLES]
    functions = _function_signatures(connection)
    if set(RUNTIME_FUNCTIONS) - set(functions):
        raise RuntimeRoleError(
            f"the schema lacks {', '.join(sorted(set(RUNTIME_FUNCTIONS) - set(functions)))}: "
            "migrate the database to the newest revision first"
        )
    for name in sorted(roles):
        grantee = _grant_reads_and_telemetry(connection, name, relations)
        if snapshots:
            connection.exec_driver_sql(
                f"GRANT INSERT, DELETE ON TABLE {', '.join(snapshots)} TO {grantee}"
            )
        connection.exec_driver_sql(
            f"GRANT EXECUTE ON FUNCTION {', '.join(functions.values())} TO {grantee}"
        )
    return sorted(roles)


def grant_gateway_privileges(connection: Connection, role: str | None = None) -> list[str]:
    """Give ``role`` (when given) and every role that already holds them the gateway
    privileges on this database: what a runtime role gets, without EXECUTE on any function
    and without writing the fold snapshots. Returns those roles, sorted."""
    roles = set(gateway_roles(connection))
    if role is not None:
        check_role_name(role)
        if role in runtime_roles(connection):
            raise RuntimeRoleError(
                f'role "{role}" is a runtime role (it may execute {APPEND_FUNCTION}): a '
                "gateway role must be another one"
            )
        roles.add(role)
    if not roles:
        return []
    relations = _relations(connection)
    functions = _function_signatures(connection)
    for name in sorted(roles):
        grantee = _grant_reads_and_telemetry(connection, name, relations)
        if functions:
            connection.exec_driver_sql(
                f"REVOKE ALL ON FUNCTION {', '.join(functions.values())} FROM {grantee}"
            )
    return sorted(roles)


def gateway_roles(connection: Connection) -> list[str]:
    """Roles other than its owner that may write ``gateway_reports`` here but not execute
    ``llmgw_append``: the gateway roles this database was set up for."""
    rows = connection.execute(
        text(
            "SELECT DISTINCT pg_get_userbyid(acl.grantee) FROM pg_class c, "
            "aclexplode(c.relacl) AS acl WHERE c.relname = :table "
            "AND c.relnamespace = to_regnamespace(current_schema()) "
            "AND acl.privilege_type = 'INSERT' AND acl.grantee <> 0 "
            "AND acl.grantee <> c.relowner"
        ),
        {"table": TELEMETRY_TABLES[0]},
    ).scalars()
    return sorted(set(rows) - set(runtime_roles(connection)))


def runtime_roles(connection: Connection) -> list[str]:
    """Roles other than its owner that may execute ``llmgw_append`` here: the runtime roles
    this database was set up for."""
    rows = connection.execute(
        text(
            "SELECT DISTINCT pg_get_userbyid(acl.grantee) FROM pg_proc p, "
            "aclexplode(p.proacl) AS acl WHERE p.proname = :function "
            "AND p.pronamespace = to_regnamespace(current_schema()) "
            "AND acl.privilege_type = 'EXECUTE' AND acl.grantee <> 0 "
            "AND acl.grantee <> p.proowner"
        ),
        {"function": APPEND_FUNCTION},
    ).scalars()
    return sorted(rows)


def creates_in_schema(schema: str) -> str:
    """Why a role that may CREATE in llmgw's schema could rewrite the log."""
    return (
        f"may create objects in schema {schema}, where llmgw's functions find what they call "
        "as the owner"
    )


def refuse_privileged(connection: Connection, role: str) -> None:
    """Raise unless ``role`` is fit to be a runtime role: no superuser, no CREATEROLE or
    BYPASSRLS, not the migrating role, no member of it, owning nothing in the schema, and
    no CREATE on it (``llmgw_append`` runs as the owner with the schema on its search_path:
    a function this role put there, a closer match for a call it makes, would run as the
    owner; PUBLIC has CREATE on ``public`` up to PostgreSQL 14)."""
    row = connection.execute(
        text(
            "SELECT r.rolsuper, r.rolcreaterole, r.rolbypassrls, "
            "has_schema_privilege(r.oid, to_regnamespace(current_schema()), 'CREATE') "
            "AS creates, current_schema() AS schema, quote_ident(current_schema()) AS quoted, "
            "quote_ident(r.rolname) AS grantee, "
            "pg_has_role(r.oid, (SELECT oid FROM pg_roles WHERE rolname = current_user), "
            "'MEMBER') AS member_of_owner, "
            "(SELECT c.relname FROM pg_class c "
            " WHERE c.relnamespace = to_regnamespace(current_schema()) "
            " AND pg_has_role(r.oid, c.relowner, 'MEMBER') ORDER BY c.relname LIMIT 1) "
            "AS owns "
            "FROM pg_roles r WHERE r.rolname = :role"
        ),
        {"role": role},
    ).one_or_none()
    if row is None:
        raise RuntimeRoleError(f'role "{role}" does not exist')
    superuser, createrole, bypassrls, creates, schema, quoted, grantee, member_of_owner, owns = row
    if creates and not (superuser or member_of_owner or owns):
        raise RuntimeRoleError(
            f'role "{role}" {creates_in_schema(schema)}: a runtime role must not be able to '
            f"rewrite the log; REVOKE CREATE ON SCHEMA {quoted} FROM {grantee} "
            "(and FROM PUBLIC)"
        )
    problem = (
        "is a superuser"
        if superuser
        else "is the role running this migration, or a member of it"
        if member_of_owner
        else f"owns {owns}, or is a member of its owner"
        if owns
        else "has CREATEROLE (it could make itself a member of the owner)"
        if createrole
        else "has BYPASSRLS"
        if bypassrls
        else None
    )
    if problem is not None:
        raise RuntimeRoleError(
            f'role "{role}" {problem}: a runtime role must not be able to rewrite the log; '
            "choose another name for it"
        )


class _Relations(NamedTuple):
    readable: list[tuple[str, str]]
    """Every table and view of the schema the migrating role owns: (qualified, bare) name."""
    sequences: list[str]


def _relations(connection: Connection) -> _Relations:
    rows = connection.execute(
        text(
            "SELECT c.oid::regclass::text, c.relkind::text, c.relname::text FROM pg_class c "
            "WHERE c.relnamespace = to_regnamespace(current_schema()) "
            "AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') "
            "AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user) "
            "ORDER BY c.relname"
        )
    ).all()
    return _Relations(
        readable=[(name, bare) for name, kind, bare in rows if kind != "S"],
        sequences=[name for name, kind, _ in rows if kind == "S"],
    )


def _grant_reads_and_telemetry(connection: Connection, name: str, relations: _Relations) -> str:
    """What a runtime and a gateway role both get, a privileged one refused first
    (``refuse_privileged``): everything it held on the schema's relations revoked, then
    SELECT on them all, and writing the gateways' telemetry. Returns its quoted name."""
    refuse_privileged(connection, name)
    grantee = _quote(connection, name)
    readable = [qualified for qualified, _ in relations.readable]
    telemetry = [qualified for qualified, bare in relations.readable if bare in TELEMETRY_TABLES]
    if readable:
        connection.exec_driver_sql(f"REVOKE ALL ON TABLE {', '.join(readable)} FROM {grantee}")
        connection.exec_driver_sql(f"GRANT SELECT ON TABLE {', '.join(readable)} TO {grantee}")
    if relations.sequences:
        connection.exec_driver_sql(
            f"REVOKE ALL ON SEQUENCE {', '.join(relations.sequences)} FROM {grantee}"
        )
    if telemetry:
        connection.exec_driver_sql(
            f"GRANT INSERT, UPDATE, DELETE ON TABLE {', '.join(telemetry)} TO {grantee}"
        )
    _grant_unless_public(connection, name, grantee)
    return grantee


def _function_signatures(connection: Connection) -> dict[str, str]:
    rows = connection.execute(
        text(
            "SELECT p.proname, p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.proname = ANY(:names) "
            "AND p.pronamespace = to_regnamespace(current_schema())"
        ),
        {"names": list(RUNTIME_FUNCTIONS)},
    ).all()
    return {name: signature for name, signature in rows}


def _grant_unless_public(connection: Connection, role: str, grantee: str) -> None:
    """CONNECT and schema USAGE, where PUBLIC's defaults do not give them already (the
    migrating role may own neither the database nor the schema)."""
    connect, usage = connection.execute(
        text(
            "SELECT has_database_privilege(:role, current_database(), 'CONNECT'), "
            "has_schema_privilege(:role, current_schema(), 'USAGE')"
        ),
        {"role": role},
    ).one()
    if not connect:
        database = connection.execute(text("SELECT quote_ident(current_database())")).scalar()
        connection.exec_driver_sql(f"GRANT CONNECT ON DATABASE {database} TO {grantee}")
    if not usage:
        schema = connection.execute(text("SELECT quote_ident(current_schema())")).scalar()
        connection.exec_driver_sql(f"GRANT USAGE ON SCHEMA {schema} TO {grantee}")


def _require_createrole(connection: Connection, role: str, action: str) -> None:
    allowed = connection.execute(
        text("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")
    ).scalar()
    if not allowed:
        current = connection.execute(text("SELECT current_user")).scalar()
        raise RuntimeRoleError(
            f'cannot {action} role "{role}": "{current}" has no CREATEROLE; have an '
            f'administrator run CREATE ROLE "{role}" LOGIN PASSWORD ... (docs/operations.md), '
            "then migrate again"
        )


def _create_role_unless_taken(connection: Connection, quoted: str) -> bool:
    """Roles are cluster-wide: another migrate (of another database, or a parallel test
    session) may create the same one meanwhile, which is as good."""
    try:
        with connection.begin_nested():
            connection.exec_driver_sql(f"CREATE ROLE {quoted} LOGIN")
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) not in (DUPLICATE_OBJECT, UNIQUE_VIOLATION):
            raise
        return False
    return True


def _set_password(connection: Connection, quoted: str, verifier: str) -> None:
    """Roles are cluster-wide: another migrate may set this role's password at the same
    moment, and PostgreSQL refuses the second of two concurrent updates of one role's row
    ("tuple concurrently updated", an internal error). Each try is a savepoint, and the
    next sees the other's committed row, so it goes through; the last to commit wins."""
    for attempt in range(1, PASSWORD_TRIES + 1):
        try:
            with connection.begin_nested():
                connection.exec_driver_sql(f"ALTER ROLE {quoted} PASSWORD '{verifier}'")
        except DBAPIError as exc:
            concurrent = getattr(exc.orig, "sqlstate", None) == INTERNAL_ERROR and (
                CONCURRENT_UPDATE in str(exc.orig)
            )
            if not concurrent or attempt == PASSWORD_TRIES:
                raise
        else:
            return


def _quote(connection: Connection, name: str) -> str:
    return connection.dialect.identifier_preparer.quote_identifier(name)
