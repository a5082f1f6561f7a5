"""``/healthz``: the process answers. ``/readyz``: it can serve, meaning the database
answers, its schema is at the revision this server was built for, and this machine's clock
is close enough to the database's for the server to append (``app.clock_offset``): one
further off is refused every write, so a load balancer should send its operators elsewhere.

The control plane's role is reported, not checked: a standby serves reads. Both endpoints
need no token, so load balancers and supervisors can probe them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from litestar import Response, get
from litestar.di import NamedDependency
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin.schemas import CheckView, ReadinessView
from app.clock_offset import leader_clock_problem, read_clock
from app.store.database import database_clock, ping, translated_errors
from app.store.errors import StoreError
from app.store.schema import (
    ReleaseRevisions,
    SchemaStanding,
    current_revision,
    release_revisions,
)

DATABASE_TIMEOUT_S = 2.0
"""How long each database check may take before it counts as failed."""
REVISION_TTL_S = 5.0
"""How long a read of the schema revision is reused: it changes only when someone migrates."""

MIGRATIONS_ADVICE = {
    SchemaStanding.MISSING: "the database is not migrated; `llmgw-server migrate` of this "
    "release brings it there",
    SchemaStanding.OLDER: "`llmgw-server migrate` of this release upgrades it",
    SchemaStanding.NEWER: "a newer llmgw release migrated it; run that release",
}
"""What to do about a schema at another revision, by where it stands: ``migrate`` cannot
take back a schema a newer release migrated."""

RoleSource = Callable[[], str]
"""Reads the control plane's current role (``leader``, ``standby``, ``stopped``)."""


class Readiness:
    """The readiness checks of one server: one ``SELECT`` per probe, and a read of the
    schema revision at most every ``revision_ttl_s``."""

    def __init__(
        self,
        engine: AsyncEngine,
        role: RoleSource | None = None,
        *,
        timeout_s: float = DATABASE_TIMEOUT_S,
        revision_ttl_s: float = REVISION_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._wall_clock = wall_clock
        self._role = role
        self._timeout_s = timeout_s
        self._revision_ttl_s = revision_ttl_s
        self._clock = clock
        self._release: ReleaseRevisions | None = None
        self._revision: str | None = None
        self._revision_read_at: float | None = None

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def check(self) -> ReadinessView:
        checks = {"database": await self._database()}
        if checks["database"].ok:
            checks["migrations"] = await self._migrations()
            checks["clock"] = await self._clock_check()
        failing = [name for name, check in checks.items() if not check.ok]
        role = self._role() if self._role is not None else None
        return ReadinessView(ready=not failing, role=role, failing=failing, checks=checks)

    async def _database(self) -> CheckView:
        try:
            async with asyncio.timeout(self._timeout_s):
                await ping(self._engine)
        except (TimeoutError, StoreError) as exc:
            return self._unanswered(exc)
        return CheckView(ok=True, detail="answers")

    async def _clock_check(self) -> CheckView:
        try:
            async with asyncio.timeout(self._timeout_s):
                reading = await read_clock(lambda: database_clock(self._engine), self._wall_clock)
        except (TimeoutError, StoreError) as exc:
            return self._unanswered(exc)
        problem = leader_clock_problem(reading)
        if problem is not None:
            return CheckView(ok=False, detail=problem)
        return CheckView(ok=True, detail=f"{reading.offset_s:+.3f} s from the database's")

    async def _migrations(self) -> CheckView:
        try:
            revision = await self._current_revision()
        except (TimeoutError, StoreError) as exc:
            return self._unanswered(exc)
        release = await self._release_revisions()
        standing = release.standing(revision)
        if standing is not SchemaStanding.CURRENT:
            return CheckView(
                ok=False,
                detail=f"schema at revision {revision or '(none)'}, this server needs "
                f"{release.head} ({MIGRATIONS_ADVICE[standing]})",
            )
        return CheckView(ok=True, detail=f"at revision {release.head}")

    def _unanswered(self, exc: TimeoutError | StoreError) -> CheckView:
        """A check whose database read failed: no answer in time, or the store's error."""
        if isinstance(exc, TimeoutError):
            return CheckView(ok=False, detail=f"no answer within {self._timeout_s:g} s")
        return CheckView(ok=False, detail=str(exc))

    async def _current_revision(self) -> str | None:
        now = self._clock()
        read_at = self._revision_read_at
        if read_at is None or now - read_at >= self._revision_ttl_s:
            async with asyncio.timeout(self._timeout_s), translated_errors():
                self._revision = await current_revision(self._engine)
            self._revision_read_at = now
        return self._revision

    async def _release_revisions(self) -> ReleaseRevisions:
        if self._release is None:
            # Reading the migration scripts' files blocks: once, off the event loop.
            self._release = await asyncio.to_thread(release_revisions)
        return self._release


@get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", include_in_schema=False)
async def readyz(readiness: NamedDependency[Readiness]) -> Response[ReadinessView]:
    view = await readiness.check()
    status = HTTP_200_OK if view.ready else HTTP_503_SERVICE_UNAVAILABLE
    return Response(view, status_code=status)
