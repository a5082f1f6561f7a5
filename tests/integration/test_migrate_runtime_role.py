"""``llmgw-server migrate --runtime-role`` as an operator runs it, on a database of its own:
the role is created once and granted on every run, its password works where the server
checks one, a table of a later migration is granted without that migration doing anything,
a role that could rewrite the log is refused, and the chain survives downgrades.

Roles belong to the whole server, so each test makes its own with a random name and drops
it afterwards (after its database, which holds its privileges).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from app.domain.envelope import Meta
from app.domain.events import NodeCordoned, NodeRegistered, node_stream
from app.store import migrate
from app.store.codec import encode_event
from app.store.database import create_engine
from app.store.errors import StoreError
from app.store.gateway_reports import write_report
from app.store.grants import RuntimeRole, ensure_runtime_role
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from app.store.privileges import may_append, privileged_role
from app.store.verification import verify_log
from tests.support.cluster import SERVER
from tests.support.postgres import LocalServer, PostgresServer, quote_identifier
from tests.support.waiting import wait_until

PROCESS_TIMEOUT_S = 120
LATER_MIGRATION = '''"""A table of a later release

Revision ID: 9001
Revises: {head}
"""

from alembic import op

revision = "9001"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE TABLE later_things (id int PRIMARY KEY)")


def downgrade() -> None:
    op.execute("DROP TABLE later_things")
'''


@dataclass
class Scratch:
    """A database and the roles a test made, all dropped when it ends."""

    server: PostgresServer
    database: str
    roles: list[str]

    @property
    def url(self) -> str:
        return self.server.url(self.database)

    def url_as(self, role: str, password: str | None = None) -> str:
        url = make_url(self.url).set(username=role, password=password)
        return url.render_as_string(hide_password=False)

    def new_role_name(self, kind: str) -> str:
        name = f"llmgw_{kind}_{uuid.uuid4().hex[:8]}"
        self.roles.append(name)
        return name

    async def admin(self, statement: str, *args: object) -> object:
        connection = await asyncpg.connect(self.url)
        try:
            return await connection.fetchval(statement, *args)
        finally:
            await connection.close()

    async def migrate(self, *flags: str, url: str | None = None, **env: str) -> Result:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        done = await asyncio.to_thread(
            subprocess.run,
            [SERVER, "migrate", "--database-url", url or self.url, *flags],
            capture_output=True,
            text=True,
            timeout=PROCESS_TIMEOUT_S,
            env={**environment, **env},
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str


@pytest_asyncio.fixture(loop_scope="session")
async def scratch(postgres_server: PostgresServer) -> AsyncIterator[Scratch]:
    name = f"llmgw_migrate_{uuid.uuid4().hex[:10]}"
    await postgres_server.create_database(name)
    scratch = Scratch(postgres_server, name, [])
    try:
        yield scratch
    finally:
        await postgres_server.drop_database(name)
        connection = await asyncpg.connect(postgres_server.admin_url)
        try:
            for role in reversed(scratch.roles):
                await connection.execute(f"DROP ROLE IF EXISTS {quote_identifier(role)}")
        finally:
            await connection.close()


async def refused(url: str) -> bool:
    return not await connects(url)


async def connects(url: str) -> bool:
    try:
        connection = await asyncpg.connect(url)
    except asyncpg.InvalidPasswordError:
        return False
    await connection.close()
    return True


async def test_migrate_twice_creates_the_role_once_and_grants_it_each_time(
    scratch: Scratch,
) -> None:
    role = scratch.new_role_name("runtime")

    first = await scratch.migrate("--runtime-role", role)
    again = await scratch.migrate("--runtime-role", role)
    plain = await scratch.migrate()

    head = migrate.head_revision()
    assert first.code == 0, first
    assert first.stdout == (
        f'database at revision {head}\nruntime role "{role}": created, privileges granted\n'
    )
    assert again.stdout == (
        f'database at revision {head}\nruntime role "{role}": found, privileges granted\n'
    )
    assert plain.stdout == (
        f'database at revision {head}\nruntime role "{role}": privileges granted again\n'
    )
    runtime = await asyncpg.connect(scratch.url_as(role))
    try:
        assert await runtime.fetchval("SELECT count(*) FROM events") == 0
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await runtime.execute("INSERT INTO models DEFAULT VALUES")
    finally:
        await runtime.close()


async def test_migrate_without_a_runtime_role_says_how_to_set_one_up(scratch: Scratch) -> None:
    result = await scratch.migrate()

    assert result.code == 0, result
    assert result.stdout.splitlines()[1] == (
        "no runtime role yet: serve and gateway refuse to run as the owner; set one up with "
        "--runtime-role llmgw_runtime (docs/security.md)"
    )


async def test_a_database_that_refuses_the_migration_is_named_in_one_line(
    scratch: Scratch,
) -> None:
    """No traceback: the operator reads what the database said, and nothing was migrated."""
    bare = scratch.new_role_name("bare")
    await scratch.admin(f"CREATE ROLE {quote_identifier(bare)} LOGIN")
    await scratch.admin("REVOKE CREATE ON SCHEMA public FROM PUBLIC")  # as PostgreSQL 15 does
    missing_database = f"{scratch.database}_missing"

    missing = await scratch.migrate(url=scratch.url.replace(scratch.database, missing_database))
    unprivileged = await scratch.migrate(url=scratch.url_as(bare))

    assert (missing.code, missing.stderr) == (
        1,
        f'llmgw-server migrate: cannot migrate: database error: database "{missing_database}" '
        "does not exist\n",
    )
    assert (unprivileged.code, unprivileged.stderr) == (
        1,
        "llmgw-server migrate: cannot migrate: database error: permission denied for schema "
        "public\n",
    )
    assert await scratch.admin("SELECT to_regclass('alembic_version') IS NULL") is True


async def test_a_table_of_a_later_migration_is_granted_without_that_migration_asking(
    scratch: Scratch, tmp_path: Path
) -> None:
    role = scratch.new_role_name("runtime")
    assert (await scratch.migrate("--runtime-role", role)).code == 0
    migrations = tmp_path / "migrations"
    shutil.copytree(migrate.migrations_dir(), migrations)
    later = LATER_MIGRATION.format(head=migrate.head_revision())
    (migrations / "versions" / "9001_later_things.py").write_text(later)

    result = await scratch.migrate(LLMGW_MIGRATIONS_DIR=str(migrations))

    assert result.code == 0, result
    assert result.stdout.splitlines() == [
        "database at revision 9001",
        f'runtime role "{role}": privileges granted again',
    ]
    runtime = await asyncpg.connect(scratch.url_as(role))
    try:
        assert await runtime.fetchval("SELECT count(*) FROM later_things") == 0
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await runtime.execute("INSERT INTO later_things VALUES (1)")
    finally:
        await runtime.close()


@pytest.mark.parametrize("who", ["a superuser", "the migrating role", "a member of the owner"])
async def test_a_role_that_could_rewrite_the_log_is_refused_as_the_runtime_role(
    scratch: Scratch, postgres_server: PostgresServer, who: str
) -> None:
    migrating = str(await scratch.admin("SELECT current_user"))
    if who == "a superuser":
        role, problem = migrating, "is a superuser"
    elif who == "the migrating role":
        role = scratch.new_role_name("owner")
        await scratch.admin(f"CREATE ROLE {role} LOGIN CREATEROLE")
        await scratch.admin(f"ALTER DATABASE {scratch.database} OWNER TO {role}")
        await scratch.admin(f"ALTER SCHEMA public OWNER TO {role}")
        migrating, problem = role, "is the role running this migration, or a member of it"
    else:
        role = scratch.new_role_name("member")
        await scratch.admin(f"CREATE ROLE {role} LOGIN IN ROLE {quote_identifier(migrating)}")
        problem = "is the role running this migration, or a member of it"

    result = await scratch.migrate("--runtime-role", role, url=scratch.url_as(migrating))

    assert result.code == 1, result
    assert result.stderr == (
        "llmgw-server migrate: "
        f'cannot migrate: role "{role}" {problem}: a runtime role must not be able to '
        "rewrite the log; choose another name for it\n"
    )


async def test_a_runtime_role_that_may_create_in_the_schema_is_refused(scratch: Scratch) -> None:
    role = scratch.new_role_name("creator")
    await scratch.admin(f"CREATE ROLE {role} LOGIN")
    await scratch.admin(f"GRANT CREATE ON SCHEMA public TO {role}")

    result = await scratch.migrate("--runtime-role", role)

    assert result.code == 1, result
    assert result.stderr == (
        "llmgw-server migrate: "
        f'cannot migrate: role "{role}" may create objects in schema public, where '
        "llmgw's functions find what they call as the owner: a runtime role must not be able "
        f"to rewrite the log; REVOKE CREATE ON SCHEMA public FROM {role} (and FROM PUBLIC)\n"
    )


async def test_an_owner_without_createrole_is_told_to_have_the_role_created_for_it(
    scratch: Scratch,
) -> None:
    owner, runtime = scratch.new_role_name("owner"), scratch.new_role_name("runtime")
    await scratch.admin(f"CREATE ROLE {owner} LOGIN")
    await scratch.admin(f"ALTER DATABASE {scratch.database} OWNER TO {owner}")
    await scratch.admin(f"ALTER SCHEMA public OWNER TO {owner}")

    refused = await scratch.migrate("--runtime-role", runtime, url=scratch.url_as(owner))
    await scratch.admin(f"CREATE ROLE {runtime} LOGIN")  # what the administrator runs
    granted = await scratch.migrate("--runtime-role", runtime, url=scratch.url_as(owner))

    assert refused.code == 1
    assert refused.stderr == (
        "llmgw-server migrate: "
        f'cannot migrate: cannot create role "{runtime}": "{owner}" has no CREATEROLE; '
        f'have an administrator run CREATE ROLE "{runtime}" LOGIN PASSWORD ... '
        "(docs/operations.md), then migrate again\n"
    )
    assert granted.code == 0, granted
    assert f'runtime role "{runtime}": found, privileges granted' in granted.stdout
    assert await scratch.admin(f"SELECT has_table_privilege('{runtime}', 'events', 'SELECT')")
    assert not await scratch.admin(f"SELECT has_table_privilege('{runtime}', 'events', 'INSERT')")


@contextlib.contextmanager
def passwords_asked_of(hba: Path, role: str) -> Iterator[None]:
    """Until the block ends, the server asks ``role`` for its password (SCRAM) instead of
    trusting it as it trusts everyone else (reload the configuration on both sides)."""
    original = hba.read_text()
    hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{original}")
    try:
        yield
    finally:
        hba.write_text(original)


async def test_the_runtime_password_logs_in_where_the_server_checks_passwords(
    scratch: Scratch, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    if not isinstance(postgres_server, LocalServer):
        pytest.skip("needs a server whose authentication the test may configure")
    role = scratch.new_role_name("runtime")
    password = "s3cret, with ünïcode and a 'quote'"
    password_file = tmp_path / "password"
    password_file.write_text(f"{password}\n")
    hba = Path(str(await scratch.admin("SHOW hba_file")))
    try:
        with passwords_asked_of(hba, role):
            await scratch.admin("SELECT pg_reload_conf()")
            from_file = await scratch.migrate(
                "--runtime-role", role, "--runtime-password-file", str(password_file)
            )
            await wait_until(lambda: refused(scratch.url_as(role, "wrong")), what="hba reloaded")
            first_works = await connects(scratch.url_as(role, password))
            changed = await scratch.migrate("--runtime-role", role, LLMGW_RUNTIME_PASSWORD="new")
            second_works = await connects(scratch.url_as(role, "new"))
            first_still_works = await connects(scratch.url_as(role, password))
    finally:
        await scratch.admin("SELECT pg_reload_conf()")

    assert from_file.stdout.splitlines()[1] == (
        f'runtime role "{role}": created, password set, privileges granted'
    )
    assert changed.stdout.splitlines()[1] == (
        f'runtime role "{role}": found, password set, privileges granted'
    )
    assert first_works
    assert second_works
    assert not first_still_works


def node_history(label: str, count: int) -> list[NodeRegistered | NodeCordoned]:
    cordons = [NodeCordoned(node_id=label, reason=f"{label} {n} ✓") for n in range(count - 1)]
    return [NodeRegistered(node_id=label, address="h"), *cordons]


# How a server before revision 0016 appended: the position its fold ends at, no event id.
APPEND_BEFORE_0016 = (
    "SELECT llmgw_append((SELECT coalesce(max(position), 0) FROM events), NULL, ARRAY[$1], "
    "ARRAY[$2::int], ARRAY[$3], ARRAY[$4::smallint], ARRAY[$5::jsonb], ARRAY[$6::uuid], "
    "ARRAY[NULL], ARRAY[$7], ARRAY[NULL], '{\"actor\": \"t\"}', now(), 't', NULL, '{}', "
    "'{}', '{}', '{}', '{}', 'llmgw_events')"
)


async def test_events_from_before_the_chain_are_chained_and_survive_a_downgrade(
    scratch: Scratch,
) -> None:
    async def append(count: int, label: str) -> None:
        engine = create_engine(scratch.url, pool_size=1)
        store = PostgresEventStore(engine)
        try:
            for event in node_history(label, count):
                await store.append(node_stream(label), None, [NewEvent(event)], Meta(actor="t"))
        finally:
            await engine.dispose()

    async def append_before_the_chain(count: int, label: str) -> None:
        connection = await asyncpg.connect(scratch.url)
        try:
            for version, event in enumerate(node_history(label, count), start=1):
                type_name, schema, data = encode_event(event)
                await connection.execute(
                    APPEND_BEFORE_0016,
                    node_stream(label),
                    version,
                    type_name,
                    schema,
                    data.decode(),
                    uuid.uuid4(),
                    label,
                )
        finally:
            await connection.close()

    async def verified() -> int:
        engine = create_engine(scratch.url, pool_size=1)
        try:
            result = await verify_log(engine)
        finally:
            await engine.dispose()
        assert result.broken is None, result.broken
        return result.events

    await asyncio.to_thread(migrate.upgrade, scratch.url, "0004")
    await append_before_the_chain(5, "before")
    await asyncio.to_thread(migrate.upgrade, scratch.url)
    chained = await verified()
    await append(3, "chained")
    await asyncio.to_thread(migrate.downgrade, scratch.url, "0004")
    await append_before_the_chain(2, "unchained")
    await asyncio.to_thread(migrate.upgrade, scratch.url)

    assert chained == 5
    assert await verified() == 10


APPEND_0005 = (
    "llmgw_append(bigint, bigint, text[], int[], text[], smallint[], jsonb[], uuid[], text[], "
    "text[], text[], jsonb, timestamptz, text, text, text[], text[], text[], text[], jsonb, text)"
)
APPEND_0016 = APPEND_0005.replace("(bigint, bigint,", "(bigint, uuid, bigint,")


async def test_the_roles_that_could_append_still_can_after_0016_replaced_the_function(
    scratch: Scratch,
) -> None:
    """A new parameter makes a new function: 0016 drops 0005's and, with it, the grants on
    it. The runtime roles that held them execute the new one, PUBLIC neither; going down
    gives them 0005's back."""
    role = scratch.new_role_name("runtime")

    async def executes(signature: str, who: str) -> object:
        return await scratch.admin(
            "SELECT coalesce(has_function_privilege($2, to_regprocedure($1), 'EXECUTE'), false)",
            signature,
            who,
        )

    await asyncio.to_thread(migrate.upgrade, scratch.url, "0015", RuntimeRole(role))
    assert (await executes(APPEND_0005, role), await executes(APPEND_0005, "public")) == (
        True,
        False,
    )

    await asyncio.to_thread(migrate.upgrade, scratch.url, "0016")  # the migration alone

    assert await scratch.admin("SELECT to_regprocedure($1)", APPEND_0005) is None
    assert await executes(APPEND_0016, role)
    assert not await executes(APPEND_0016, "public")
    engine = create_engine(scratch.url_as(role), pool_size=1)
    try:
        store = PostgresEventStore(engine, policy=None)
        for event in node_history("gpu-1", 2):
            await store.append(node_stream("gpu-1"), None, [NewEvent(event)], Meta(actor="t"))
    finally:
        await engine.dispose()

    await asyncio.to_thread(migrate.downgrade, scratch.url, "0015")

    assert await scratch.admin("SELECT to_regprocedure($1)", APPEND_0016) is None
    assert await executes(APPEND_0005, role)
    assert not await executes(APPEND_0005, "public")

    await asyncio.to_thread(migrate.upgrade, scratch.url, "0016")

    assert await executes(APPEND_0016, role)
    assert await scratch.admin("SELECT count(*) FROM events") == 2


async def test_0017_bounds_the_runtime_roles_times_keeps_its_grants_and_the_old_chain(
    scratch: Scratch,
) -> None:
    """Before 0017 a runtime role recorded events at any time it gave; after it, only near
    the database's clock. The function is replaced in place: the role keeps its grant both
    ways, and the events recorded before (backdated ones too) still verify."""
    role = scratch.new_role_name("runtime")
    now = datetime.now(UTC)

    async def append_as_runtime(label: str, at: datetime) -> None:
        engine = create_engine(scratch.url_as(role), pool_size=1)
        try:
            store = PostgresEventStore(engine, clock=lambda: at, policy=None)
            for event in node_history(label, 2):
                await store.append(node_stream(label), None, [NewEvent(event)], Meta(actor="t"))
        finally:
            await engine.dispose()

    async def verified() -> int:
        engine = create_engine(scratch.url, pool_size=1)
        try:
            result = await verify_log(engine)
        finally:
            await engine.dispose()
        assert result.broken is None, result.broken
        return result.events

    await asyncio.to_thread(migrate.upgrade, scratch.url, "0016", RuntimeRole(role))
    await append_as_runtime("backdated", now - timedelta(days=30))

    await asyncio.to_thread(migrate.upgrade, scratch.url, "0017")

    with pytest.raises(StoreError, match="from the database's clock"):
        await append_as_runtime("backdated-again", now - timedelta(days=30))
    await append_as_runtime("on-time", datetime.now(UTC))
    assert await verified() == 4

    await asyncio.to_thread(migrate.downgrade, scratch.url, "0016")
    await append_as_runtime("backdated-below", now - timedelta(days=30))
    await asyncio.to_thread(migrate.upgrade, scratch.url, "0017")

    with pytest.raises(StoreError, match="from the database's clock"):
        await append_as_runtime("backdated-again", now - timedelta(days=30))
    await append_as_runtime("on-time-again", datetime.now(UTC))
    assert await verified() == 8


async def test_the_gateway_role_reads_and_reports_but_cannot_append_or_write_a_row(
    scratch: Scratch,
) -> None:
    """A standalone gateway reads the routing snapshot and writes its reports; with the
    gateway role it cannot reach ``llmgw_append``, so not the projection tables either."""
    runtime, gateway = scratch.new_role_name("runtime"), scratch.new_role_name("gateway")

    first = await scratch.migrate("--runtime-role", runtime, "--gateway-role", gateway)

    assert first.code == 0, first.stderr
    assert f'gateway role "{gateway}": created, privileges granted' in first.stdout
    engine = create_engine(scratch.url_as(gateway), pool_size=1)
    as_gateway = await asyncpg.connect(scratch.url_as(gateway))
    try:
        store = PostgresEventStore(engine, policy=None)
        with pytest.raises(StoreError, match="permission denied for function llmgw_append"):
            await store.append(
                node_stream("gpu-1"), None, [NewEvent(node_history("gpu-1", 1)[0])], Meta(actor="t")
            )
        for statement in (
            "SELECT llmgw_next_epoch('gateway')",
            "INSERT INTO fold_snapshots SELECT * FROM fold_snapshots",
            "DELETE FROM fold_snapshot_chunks",
            "UPDATE nodes SET address = 'x'",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await as_gateway.execute(statement)
        await write_report(as_gateway, "gw-1", {"m-1": 2}, within_s=5, instance="test")
        assert await as_gateway.fetchval("SELECT count(*) FROM gateway_reports") == 1
        assert await as_gateway.fetchval("SELECT count(*) FROM routing_table") == 0
    finally:
        await as_gateway.close()
        await engine.dispose()
    assert await privileged_role(scratch.url_as(gateway)) == (gateway, None)
    assert not await may_append(scratch.url_as(gateway))
    assert await may_append(scratch.url_as(runtime))

    again = await scratch.migrate()
    both = await scratch.migrate("--runtime-role", gateway, "--gateway-role", gateway)

    assert f'gateway role "{gateway}": privileges granted again' in again.stdout
    assert f'runtime role "{gateway}"' not in again.stdout
    assert both.code == 2
    assert "cannot be both the runtime and the gateway role" in both.stderr


async def test_a_migration_whose_session_is_ended_says_so_and_runs_again(scratch: Scratch) -> None:
    """An administrator ends migrate's session while it waits for another run's lock: it
    exits 1 in one line saying so and that running it again is safe, and running it again
    migrates."""
    holder = await asyncpg.connect(scratch.url)
    await holder.execute("SELECT pg_advisory_lock($1)", migrate.MIGRATE_LOCK_KEY)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    running = await asyncio.create_subprocess_exec(
        SERVER,
        "migrate",
        "--database-url",
        scratch.url,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
    )
    waiting_for_lock = (
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'advisory' "
        "AND pid <> pg_backend_pid()"
    )
    try:

        async def migrate_waits() -> bool:
            return await holder.fetchval(waiting_for_lock, scratch.database) is not None

        await wait_until(migrate_waits, within_s=60, what="migrate waiting for the lock")
        pid = await holder.fetchval(waiting_for_lock, scratch.database)
        assert await holder.fetchval("SELECT pg_terminate_backend($1)", pid) is True
        _, stderr = await asyncio.wait_for(running.communicate(), PROCESS_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            running.kill()
        await holder.close()

    assert (running.returncode, stderr.decode()) == (
        1,
        "llmgw-server migrate: cannot migrate: database connection lost: connection was "
        "closed in the middle of operation: terminating connection due to administrator "
        "command; running migrate again is safe: each of its steps (the roles, the "
        "revisions, the grants) is one transaction, which the database undoes when its "
        "connection ends, and a step already done is found done\n",
    )
    again = await scratch.migrate()
    assert again.code == 0, again.stderr


async def test_migrations_that_set_one_roles_password_at_once_all_succeed(scratch: Scratch) -> None:
    """Roles are the whole server's: migrations of several databases (two dev clusters on
    one machine) may set the same runtime role's password at the same moment, and PostgreSQL
    refuses the second of two concurrent updates of a role ("tuple concurrently updated").
    Each of them still succeeds, and the role ends with a password set."""
    role = scratch.new_role_name("runtime")
    passwords = [f"password-{index}" for index in range(6)]
    engine = create_engine(scratch.server.sqlalchemy_url(scratch.database), pool_size=6)

    async def set_password(password: str) -> None:
        async with engine.begin() as connection:
            await connection.run_sync(
                lambda sync: ensure_runtime_role(sync, RuntimeRole(role, password))
            )

    try:
        for _ in range(10):
            await asyncio.gather(*(set_password(password) for password in passwords))
    finally:
        await engine.dispose()
    stored = await scratch.admin("SELECT rolpassword FROM pg_authid WHERE rolname = $1", role)
    assert str(stored).startswith("SCRAM-SHA-256$4096:")
