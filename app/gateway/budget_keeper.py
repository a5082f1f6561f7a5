"""Keeps a gateway's ``SharedLimiter`` supplied: the I/O around ``app.gateway.sharedlimits``.

On a connection of its own (``app.gateway.reconnecting``), it

- asks PostgreSQL for the grants the budgets want, as soon as a request notes that one
  wants more (``wake``), so the next slice arrives before the last one runs out;
- gives back, every ``TICK_S``, the leases that were not used in time, and on ``close``
  everything still held;
- counts the live gateways (their reports) every ``COUNT_GATEWAYS_EVERY_S``, for the local
  share the limiter falls back to;
- deletes every key's aged rows every ``FORGET_AGED_EVERY_S`` (at once again while a
  backlog lasts): a key revoked or no longer used is granted nothing again, and would keep
  its last rows for ever.

When the database does not answer, the limiter is marked ``degraded`` (logged once as
``rate_limits_degraded``, ``llmgw_gateway_rate_limits_degraded`` is 1, and ``/readyz``
says so): gateways then keep what they hold and fall back to their local share. It
reconnects with backoff; the first grant that succeeds ends it (``rate_limits_shared``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from time import monotonic

import asyncpg
import structlog

from app.gateway.reconnecting import CONNECTION_LOST, ConnectedTask
from app.gateway.sharedlimits import GRANT_ANSWER_WITHIN_S, Return, SharedLimiter
from app.store.database import driver_url
from app.store.gateway_reports import REPORT_MAX_AGE_S
from app.store.rate_budgets import FORGET_BATCH, forget_aged, grant, live_gateways, release

log = structlog.get_logger(__name__)

TICK_S = 0.1
COUNT_GATEWAYS_EVERY_S = 2.0
FORGET_AGED_EVERY_S = 60.0
QUERY_TIMEOUT_S = GRANT_ANSWER_WITHIN_S
"""A refusal of a request whose grant is unanswered tells its client to wait this long."""


class BudgetKeeper:
    def __init__(
        self,
        database_url: str,
        limiter: SharedLimiter,
        *,
        gateway_id: str,
        on_degraded: Callable[[bool], None] = lambda _: None,
        query_timeout_s: float = QUERY_TIMEOUT_S,
    ) -> None:
        self._connection = ConnectedTask(
            driver_url(database_url),
            application_name=f"llmgw-budgets-{gateway_id}",
            timeout_s=query_timeout_s,
        )
        self.limiter = limiter
        self._gateway_id = gateway_id
        self._on_degraded = on_degraded
        self._timeout_s = query_timeout_s
        self.last_error: str | None = None
        self.grants = 0
        """Grants answered so far (tests wait on it)."""

    def wake(self) -> None:
        """A budget wants a grant: ask now rather than at the next tick."""
        self._connection.wake.set()

    def degraded_reason(self) -> str | None:
        """Why limits are not shared now, for ``/readyz``; None while they are."""
        if not self.limiter.degraded:
            return None
        return (
            f"rate limits are enforced locally: the database does not answer "
            f"({self.last_error}); each key gets what this gateway holds, then 1/"
            f"{self.limiter.gateways} of its limit"
        )

    async def start(self) -> None:
        self._connection.start(
            self._keep_then_give_back,
            lost=self._unreachable,
            failed=lambda: log.exception("rate_budget_failed"),
        )

    async def close(self) -> None:
        """Stop, giving back every lease still held if the database answers."""
        await self._connection.close()

    async def _keep_then_give_back(self, db: asyncpg.Connection) -> None:
        await self._keep(db)
        with contextlib.suppress(*CONNECTION_LOST):
            await self._give_back(db, self.limiter.everything_held())

    async def _keep(self, db: asyncpg.Connection) -> None:
        next_count = next_forget = 0.0
        while not self._connection.stop.is_set():
            now = monotonic()
            if now >= next_count:
                self.limiter.gateways = max(
                    1, await live_gateways(db, REPORT_MAX_AGE_S, within_s=self._timeout_s)
                )
                next_count = now + COUNT_GATEWAYS_EVERY_S
            if now >= next_forget:
                forgotten = await forget_aged(db, within_s=self._timeout_s)
                next_forget = now if forgotten >= FORGET_BATCH else now + FORGET_AGED_EVERY_S
            for ask in self.limiter.asks(now):
                try:
                    given = await grant(
                        db, ask.key_id, ask.resource, ask.limit, ask.want, within_s=self._timeout_s
                    )
                except BaseException:
                    self.limiter.unanswered(ask)
                    raise
                self.limiter.granted(
                    ask, given.amount, given.second, given.used, given.room_in_s, monotonic()
                )
                self.grants += 1
                self._reachable()
            await self._give_back(db, self.limiter.expired(monotonic()))
            self._reachable()
            await self._connection.wait_turn(monotonic() + TICK_S)

    async def _give_back(self, db: asyncpg.Connection, returns: list[Return]) -> None:
        for back in returns:
            await release(
                db, back.key_id, back.resource, back.second, back.amount, within_s=self._timeout_s
            )

    def _unreachable(self, exc: BaseException) -> None:
        self.last_error = str(exc) or type(exc).__name__
        # What was held is kept; leases that expire meanwhile are not given back (the
        # database counts them until they age out).
        self.limiter.expired(monotonic())
        if not self.limiter.degraded:
            self.limiter.degraded = True
            self._on_degraded(True)
            log.warning(
                "rate_limits_degraded",
                gateway_id=self._gateway_id,
                error=self.last_error,
                share=f"1/{self.limiter.gateways} of each key's limit beyond what is held",
            )

    def _reachable(self) -> None:
        if self.limiter.degraded:
            self.limiter.degraded = False
            self.last_error = None
            self._on_degraded(False)
            log.info("rate_limits_shared", gateway_id=self._gateway_id)
