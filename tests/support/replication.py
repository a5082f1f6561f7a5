"""A PostgreSQL primary and a hot standby with streaming replication, from the local
binaries, and the failover a Patroni or a managed service performs: the primary dies
(SIGKILL, every backend with it, as when its machine goes) and the standby is promoted.

    async with ReplicatedPostgres(synchronous=True) as pair:
        url = pair.url("llmgw")            # postgresql://...@primary,standby/llmgw?...
        ...
        await pair.kill_primary()
        await pair.promote_standby()

The standby is a ``pg_basebackup -R`` copy of the primary streaming from a replication
slot. ``synchronous=True`` makes the primary wait for the standby to have flushed every
commit (``synchronous_standby_names = '*'``, ``synchronous_commit = on``), set once the
standby streams, so that the copy itself does not wait for a standby that is not there
yet. ``cut_replication()`` stops the standby receiving WAL (it forgets its primary, as a
partitioned standby would): what the primary commits afterwards is what an asynchronous
failover loses.

Both clusters are throwaway: ports are claimed free, files are removed and processes
stopped on exit, passed or failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import asyncpg

from devcluster.errors import DevDatabaseError
from devcluster.postgres import SUPERUSER, SYSTEM_USER, LocalPostgres, find_bindir
from tests.support.ports import free_port
from tests.support.waiting import wait_until

HOST = "127.0.0.1"
SLOT = "llmgw_standby"
COMMAND_TIMEOUT_S = 120
FAST_SETTINGS = {"fsync": "off", "full_page_writes": "off"}
"""Nothing here outlives the test: no fsync, on either side. Durability against the loss of
a process (what the tests do) still holds: a killed primary's commits are in the kernel's
page cache on the standby's side once it acknowledged them."""
SYNCHRONOUS = {"synchronous_standby_names": "'*'", "synchronous_commit": "on"}


class ReplicatedPostgres:
    def __init__(self, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        self._bindir = find_bindir()
        self._as_system_user = os.geteuid() == 0
        self.primary = LocalPostgres(
            durable=False,
            port=free_port(),
            settings={**FAST_SETTINGS, "synchronous_commit": "on", "wal_keep_size": "64MB"},
        )
        self._standby_dir = Path(tempfile.mkdtemp(prefix="llmgw-pg-standby-"))
        self.standby = LocalPostgres(
            self._standby_dir, durable=False, port=free_port(), settings=FAST_SETTINGS
        )
        self.promoted = False
        self._primary_killed = False

    # -- addresses --------------------------------------------------------------------------

    def url(self, database: str) -> str:
        """The libpq multi-host URL of ``database``: whichever of the two is the primary."""
        hosts = f"{HOST}:{self.primary.port},{HOST}:{self.standby.port}"
        return f"postgresql://{SUPERUSER}@{hosts}/{database}?target_session_attrs=read-write"

    def primary_url(self, database: str = "postgres") -> str:
        return self.primary.url(database)

    def standby_url(self, database: str = "postgres") -> str:
        return self.standby.url(database)

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> ReplicatedPostgres:
        try:
            await asyncio.to_thread(self._start)
            await self._wait_streaming()
            if self.synchronous:
                await self._make_synchronous()
        except BaseException:
            await asyncio.to_thread(self.close)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop both (the killed primary is already gone) and remove their files."""
        try:
            with contextlib.suppress(DevDatabaseError):
                self.standby.stop()
        finally:
            shutil.rmtree(self._standby_dir, ignore_errors=True)
            if self._primary_killed and self.primary.state_dir is not None:
                # Its pid may name another process by now: nothing is left to stop.
                (self.primary.state_dir / "data" / "postmaster.pid").unlink(missing_ok=True)
            self.primary.close()

    def _start(self) -> None:
        self.primary.start()
        self._hand_to_system_user(self._standby_dir)
        self._run(
            "pg_basebackup",
            *("-D", str(self._standby_dir / "data")),
            *("-h", HOST, "-p", str(self.primary.port), "-U", SUPERUSER),
            *("-X", "stream", "-R", "-C", "-S", SLOT, "--no-sync", "--checkpoint=fast"),
        )
        self.standby.start()

    async def _wait_streaming(self) -> None:
        async def streams() -> bool:
            state = await self._primary_fetchval(
                "SELECT state FROM pg_stat_replication WHERE application_name = 'walreceiver'"
            )
            return state == "streaming"

        await wait_until(streams, within_s=30.0, every_s=0.05, what="the standby streaming")

    async def _make_synchronous(self) -> None:
        for name, value in SYNCHRONOUS.items():
            await self._primary_execute(f"ALTER SYSTEM SET {name} = {value}")
        await self._primary_execute("SELECT pg_reload_conf()")

        async def synchronous() -> bool:
            state = await self._primary_fetchval(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'walreceiver'"
            )
            return state == "sync"

        await wait_until(synchronous, within_s=30.0, every_s=0.05, what="the standby in sync")

    # -- failures ---------------------------------------------------------------------------

    async def cut_replication(self) -> None:
        """The standby stops receiving WAL: it forgets its primary (``primary_conninfo``
        emptied and reloaded ends its WAL receiver) and does not ask again."""
        if self.synchronous:
            raise AssertionError("a synchronous primary would wait for the standby forever")
        connection = await asyncpg.connect(self.standby_url())
        try:
            await connection.execute("ALTER SYSTEM SET primary_conninfo = ''")
            await connection.execute("SELECT pg_reload_conf()")
        finally:
            await connection.close()

        async def gone() -> bool:
            count = await self._primary_fetchval("SELECT count(*) FROM pg_stat_replication")
            return count == 0

        await wait_until(gone, within_s=30.0, every_s=0.05, what="the standby cut off")

    async def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every backend of it at once: a crash, not a
        shutdown (nothing is flushed, no client is told)."""
        data = self.primary.state_dir
        assert data is not None, "the primary runs"
        pid = int((data / "data" / "postmaster.pid").read_text().split()[0])
        children = _children_of(pid)
        self._primary_killed = True
        for victim in (pid, *children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)

        def dead() -> bool:
            return not any(_alive(p) for p in (pid, *children))

        await wait_until(dead, within_s=10.0, what="the primary dead")

    async def promote_standby(self) -> None:
        """``pg_ctl promote``, then until it accepts writes."""
        await asyncio.to_thread(
            self._run, "pg_ctl", "promote", "-w", "-D", str(self._standby_dir / "data")
        )

        async def writable() -> bool:
            connection = await asyncpg.connect(self.standby_url())
            try:
                return not await connection.fetchval("SELECT pg_is_in_recovery()")
            finally:
                await connection.close()

        await wait_until(writable, within_s=30.0, every_s=0.05, what="the standby promoted")
        self.promoted = True

    # -- helpers ----------------------------------------------------------------------------

    async def _primary_fetchval(self, query: str) -> object:
        connection = await asyncpg.connect(self.primary_url())
        try:
            return await connection.fetchval(query)
        finally:
            await connection.close()

    async def _primary_execute(self, statement: str) -> None:
        connection = await asyncpg.connect(self.primary_url())
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    def _run(self, program: str, *args: str) -> None:
        command = [str(self._bindir / program), *args]
        if self._as_system_user:
            command = ["runuser", "-u", SYSTEM_USER, "--", *command]
        result = subprocess.run(
            command,
            cwd=self._standby_dir,
            capture_output=True,
            text=True,
            check=False,
            timeout=COMMAND_TIMEOUT_S,
        )
        if result.returncode != 0:
            raise DevDatabaseError(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}")

    def _hand_to_system_user(self, path: Path) -> None:
        if self._as_system_user:
            shutil.chown(path, SYSTEM_USER, SYSTEM_USER)


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                children.append(int(entry.name))
    return children


def _alive(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
