"""A key's rpm and tpm counted across every gateway: slices of its budget leased from
PostgreSQL ahead of need, so that no request waits on the database. The design and its
bounds are in docs/gateway.md ("Limits across gateways"); the store side is
``app.store.rate_budgets``, the I/O ``app.gateway.budget_keeper``.

Per key and resource (requests or tokens) a gateway keeps a ``Budget``: the leases it
holds (each what is left of one grant, the database's second it was granted in, and when
it must be used by) and its debt. A request takes its cost from the leases, oldest first.
When they do not cover it, it may still go through on credit of at most one slice (and no
more than the last grant said was left of the minute) while no grant was refused lately:
the cost becomes debt, which the next grant pays first. So
the first request of a key that was idle does not wait for the database, and what a
gateway admits is never more than it was granted plus one slice.

The slice adapts to the key's rate here: what this gateway admitted of it over the last
``RATE_SPAN_S``, scaled to ``LEAD_S`` of traffic, between one request and
``MAX_SLICE_SHARE`` of the limit. A budget asks for more when what it holds falls to half
a slice, so the next grant normally lands before the last one runs out. A lease not used
within ``LEASE_HOLD_S`` of its grant is returned: the database forgets a grant a minute
after it was made, and a slice used much later would slip out of the count early.

While PostgreSQL is away (``degraded``) a gateway uses what it holds, and beyond that falls
back to its local share: the key's limit divided by the gateways that were live when it
last knew, counted over a sliding minute by ``RateLimiter``.

A burst faster than the slices grow can find nothing held and the credit spent while the
grant asked for is on its way: such a request is ``pending``, and waits for the keeper's
next answer (``answered``, at most ``GRANT_WAIT_S`` in ``app.gateway.exchange_steps``)
rather than being refused while the key has room. At a steady rate it never happens.

A request refused is told when it may be admitted (``Budget.wait_s``): never sooner than
``can_take`` could say yes if nothing else came, so that a client that waits as long is not
refused again for the same reason; where that hangs on a grant not answered yet, the time
the database has to answer it.

No I/O and no clock of its own (``now`` is monotonic seconds, passed in); ``answered``
is the one thing that awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from app.gateway.ratelimit import ALLOWED_UNLIMITED, Quota, RateDecision, RateLimiter

LEASE_HOLD_S = 2.0
LEAD_S = 1.0
RATE_SPAN_S = 2.0
MAX_SLICE_SHARE = 0.01
"""A slice is at most 1 % of the limit (and at least one request, or the request's cost)."""
REFUSED_RETRY_S = (0.05, 1.0)
"""After a refused grant, ask again no sooner and no later than this."""
WINDOW_S = 60.0
ROOM_KNOWN_S = 1.0
"""How long what the last grant said was left of the key's minute bounds the credit."""
GRANT_ANSWER_WITHIN_S = 2.0
"""How long a grant asked for may go unanswered: the keeper's query timeout
(``app.gateway.budget_keeper``), past which the limiter is ``degraded`` instead."""
MIN_RETRY_AFTER_S = 0.05
"""The least a refusal says, however soon the request may fit."""

REQUESTS = "rpm"
TOKENS = "tpm"


@dataclass
class Lease:
    second: int
    left: int
    use_by: float


@dataclass(frozen=True)
class Ask:
    """A grant a budget wants: sent by the keeper, answered with ``granted``/``refused``."""

    key_id: str
    resource: str
    limit: int
    want: int


@dataclass(frozen=True)
class Return:
    """What was not used of a grant, to give back to its second."""

    key_id: str
    resource: str
    second: int
    amount: int


class Budget:
    """One key's limit of one resource, as this gateway holds it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.leases: deque[Lease] = deque()
        self.debt = 0
        self.asking = False
        self.refused_until = 0.0
        """When to ask the database again after a refusal (other gateways may give back
        what they hold sooner than the minute has room)."""
        self.room_at = 0.0
        """While the key's minute is spent: when its oldest grant ages out."""
        self.used = 0
        """The key's count over the last minute at the last grant (every gateway's)."""
        self._recent = [0.0, 0.0]
        self._recent_bucket = 0
        self.last_used = -math.inf
        self.refused_at = -math.inf
        """When a request was last refused for want of this budget: a key whose requests
        are refused is not idle, and is asked for again once ``refused_until`` has passed."""
        self.answered_at = -math.inf
        self.asked_at = -math.inf
        """When the grant being asked for (``asking``) was asked for."""
        self.last_second: int | None = None
        """The database's second of the latest grant."""
        self.last_granted_at = -math.inf
        """When the latest grant came (``now``'s clock)."""
        self.unsettled = 0
        """Reservations taken here whose answers have not ended yet: their tokens are
        charged here when they do, however long that takes."""

    def held(self) -> int:
        return sum(lease.left for lease in self.leases) - self.debt

    def slice(self, now: float, cost: int = 1) -> int:
        rate = self._rate(now)
        largest = max(1, math.floor(self.limit * MAX_SLICE_SHARE), cost)
        return max(1, cost, min(largest, math.ceil(rate * LEAD_S)))

    def can_take(self, cost: int, now: float, degraded: bool) -> bool:
        held = self.held()
        if held >= cost:
            return True
        if degraded or now < self.refused_until or now < self.room_at:
            # No credit while the key's minute is spent: the debt would take it over.
            return False
        room = self.limit - self.used if now - self.answered_at < ROOM_KNOWN_S else self.limit
        return cost - held <= min(self.slice(now, cost), room)

    def take(self, cost: int, now: float) -> None:
        self._count(cost, now)
        self.last_used = now
        while cost > 0 and self.leases:
            lease = self.leases[0]
            used = min(cost, lease.left)
            lease.left -= used
            cost -= used
            if lease.left == 0:
                self.leases.popleft()
        self.debt += cost

    def give_back(self, amount: int, now: float) -> None:
        """A reservation was larger than what the request used."""
        paid = min(amount, self.debt)
        self.debt -= paid
        amount -= paid
        if amount <= 0:
            return
        if self.leases:
            self.leases[-1].left += amount
        elif self.last_second is not None and now - self.last_granted_at < WINDOW_S:
            # The reservation was paid by a grant of the last minute: what it did not use
            # can be used again, or goes back to the latest grant's second. Past a minute
            # (an answer that outlasted one) no grant of it counts any more: nothing is
            # left to give back.
            self.leases.append(Lease(self.last_second, amount, now + LEASE_HOLD_S))

    def want(self, now: float) -> int:
        """How much to ask for now; 0: nothing (asking already, refused lately, idle: no
        request taken or refused for ``LEASE_HOLD_S``, or holding enough). A debt is asked
        for however long the key has been idle: only a grant pays it, and until one does,
        every request of the key is refused."""
        if self.asking or now < self.refused_until:
            return 0
        if now - max(self.last_used, self.refused_at) > LEASE_HOLD_S and self.debt == 0:
            return 0
        size = self.slice(now)
        held = self.held()
        if held * 2 > size:
            return 0
        return size - held

    def granted(self, amount: int, second: int, used: int, room_in_s: float, now: float) -> None:
        self.asking = False
        self.used = used
        self.answered_at = now
        self.room_at = 0.0
        if used >= self.limit:
            # The minute is spent: no credit until room may have opened.
            self.refused(room_in_s, used, now)
        self.last_second = second
        self.last_granted_at = now
        paid = min(amount, self.debt)
        self.debt -= paid
        if amount - paid > 0:
            self.leases.append(Lease(second, amount - paid, now + LEASE_HOLD_S))

    def refused(self, room_in_s: float, used: int, now: float) -> None:
        low, high = REFUSED_RETRY_S
        self.asking = False
        self.used = used
        self.answered_at = now
        self.room_at = now + room_in_s
        self.refused_until = now + min(high, max(low, room_in_s))

    def wait_s(self, cost: int, now: float) -> float:
        """How long a request of ``cost`` refused now waits until ``can_take`` may admit
        it, if nothing else comes: until the gateway may ask again and the key's minute
        has room, until the room the last grant told of is no longer held against the
        credit, and for a debt beyond one slice (which only a grant pays), until the grant
        on its way has been answered, or beyond the limit, until the minutes that may pay
        it have passed. Never less: a client that waits that long is not
        refused again for the same reason."""
        held = self.held()
        if held >= cost:
            return 0.0
        at = max(now, self.refused_until, self.room_at)
        needed = cost - held
        if needed > self.limit:
            # A debt beyond the limit: grants pay at most the limit a minute, so the
            # minutes until they may have paid for it and this request.
            minutes = math.ceil(needed / self.limit) - 1
            at = max(at, max(now, self.room_at) + WINDOW_S * minutes)
        if needed > self.slice(now, cost):
            if self.asking:
                at = max(at, self.asked_at + GRANT_ANSWER_WITHIN_S)
        elif needed > self.limit - self.used and now - self.answered_at < ROOM_KNOWN_S:
            at = max(at, self.answered_at + ROOM_KNOWN_S)
        return at - now

    def expire(self, now: float) -> list[Lease]:
        """Leases past their use-by time, which go back to the minute: what they held
        is room again, so the minute is no longer known to be spent."""
        gone: list[Lease] = []
        while self.leases and self.leases[0].use_by <= now:
            gone.append(self.leases.popleft())
        returned = sum(lease.left for lease in gone)
        if returned > 0:
            self.used = max(0, self.used - returned)
            self.room_at = 0.0
            self.refused_until = min(self.refused_until, now)
        return gone

    def idle(self, now: float) -> bool:
        return (
            not self.leases
            and self.debt == 0
            and not self.asking
            and self.unsettled == 0
            and now - self.last_used > WINDOW_S
        )

    def quota(self, now: float) -> Quota:
        # ``used`` counts every grant of the minute, what this gateway still holds of them
        # included; ``held`` adds that back and takes off the debt (taken, not yet granted).
        remaining = max(0, min(self.limit, self.limit - self.used + self.held()))
        reset_s = 0.0 if remaining == self.limit else WINDOW_S
        if now < self.room_at:
            remaining, reset_s = max(0, self.held()), min(WINDOW_S, self.room_at - now)
        return Quota(limit=self.limit, remaining=remaining, reset_s=reset_s)

    def _count(self, cost: int, now: float) -> None:
        bucket = math.floor(now / RATE_SPAN_S)
        if bucket != self._recent_bucket:
            self._recent = [self._recent[1] if bucket == self._recent_bucket + 1 else 0.0, 0.0]
            self._recent_bucket = bucket
        self._recent[1] += cost

    def _rate(self, now: float) -> float:
        """Per second, over the last ``RATE_SPAN_S`` (the previous bucket and this one)."""
        bucket = math.floor(now / RATE_SPAN_S)
        if bucket == self._recent_bucket:
            return (self._recent[0] + self._recent[1]) / (2 * RATE_SPAN_S)
        if bucket == self._recent_bucket + 1:
            return self._recent[1] / (2 * RATE_SPAN_S)
        return 0.0


class SharedLimiter:
    """``RateLimiter``'s interface over budgets leased from the database.

    The callback given to ``on_ask`` is called on the request's path (so it must only note
    it) whenever a budget wants a grant; the keeper then takes ``asks()`` and answers each
    with ``granted`` (an amount of 0 is a refusal) or ``unanswered``."""

    def __init__(self) -> None:
        self._budgets: dict[tuple[str, str], Budget] = {}
        self._on_ask: Callable[[], None] = lambda: None
        self._local = RateLimiter()
        self._answer = asyncio.Event()
        self.degraded = False
        self.gateways = 1
        """Live gateways when last known: the local share is the limit divided by it."""
        self.fallbacks = 0
        """Requests admitted or refused on the local share (while degraded)."""

    def on_ask(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when a budget wants a grant (the keeper's ``wake``)."""
        self._on_ask = callback

    # -- the request path -----------------------------------------------------------------

    def admit(
        self, key_id: str, *, rpm: int | None, tpm: int | None, now: float, tokens: int = 1
    ) -> RateDecision:
        """Admit one request of ``key_id`` reserving ``tokens`` (an estimate, settled by
        ``record_tokens``), or say how long to wait."""
        if rpm is None and tpm is None:
            return ALLOWED_UNLIMITED
        # A reservation is at most the whole limit: a request that asks for more than a
        # minute's tokens may still run, once the minute is all its own.
        tokens = max(1, tokens if tpm is None else min(tokens, tpm))
        wanted = [
            (self._budget(key_id, resource, limit), cost)
            for resource, limit, cost in ((REQUESTS, rpm, 1), (TOKENS, tpm, tokens))
            if limit is not None
        ]
        if all(budget.can_take(cost, now, self.degraded) for budget, cost in wanted):
            for budget, cost in wanted:
                budget.take(cost, now)
            reserved = 0
            if tpm is not None:
                reserved = tokens
                self._budgets[(key_id, TOKENS)].unsettled += 1
            decision = self._decision(True, 0.0, key_id, rpm, tpm, now, reserved)
        elif self.degraded:
            decision = self._local_share(key_id, rpm, tpm, now)
        else:
            waits = [budget.wait_s(cost, now) for budget, cost in wanted]
            for budget, _ in wanted:
                budget.refused_at = now
            decision = self._decision(False, max(MIN_RETRY_AFTER_S, *waits), key_id, rpm, tpm, now)
        if any(budget.want(now) for budget, _ in wanted):
            self._on_ask()
        if not decision.allowed and not self.degraded:
            pending = any(budget.asking or budget.want(now) for budget, _ in wanted) and all(
                now >= budget.refused_until for budget, _ in wanted
            )
            if pending:
                decision = msgspec.structs.replace(decision, pending=True)
        return decision

    async def answered(self, within_s: float) -> None:
        """Until the keeper's next answer to a grant (any key's), or ``within_s``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                await self._answer.wait()

    def record_tokens(self, key_id: str, tokens: int, *, now: float, reserved: int = 0) -> None:
        """Settle a request's tokens: ``tokens`` used, ``reserved`` taken at admission (a
        call with ``reserved`` settles the request: until then its key's budget is kept,
        for an answer that streams for longer than a minute of a key idle otherwise).

        A count below zero is read as zero, as ``RateLimiter`` reads it and ``admit`` reads a
        reservation below one: settling gives back at most what was reserved, so no caller
        can credit a key with tokens (which would go back to the database and so to every
        gateway). Clamped rather than refused: this runs once the answer is sent, with
        no one left to tell."""
        tokens, reserved = max(0, tokens), max(0, reserved)
        budget = self._budgets.get((key_id, TOKENS))
        if budget is None:
            return
        if reserved > 0 and budget.unsettled > 0:
            budget.unsettled -= 1
        if self.degraded and tokens > 0:
            self._local.record_tokens(key_id, tokens, now=now)
        if tokens > reserved:
            budget.take(tokens - reserved, now)
        elif reserved > tokens:
            budget.give_back(reserved - tokens, now)
        if budget.want(now):
            self._on_ask()

    # -- the keeper's side ------------------------------------------------------------------

    def asks(self, now: float) -> list[Ask]:
        """The grants wanted now; each is marked asked until answered."""
        found: list[Ask] = []
        for (key_id, resource), budget in self._budgets.items():
            want = budget.want(now)
            if want > 0:
                budget.asking = True
                budget.asked_at = now
                found.append(Ask(key_id, resource, budget.limit, want))
        return found

    def granted(
        self, ask: Ask, amount: int, second: int, used: int, room_in_s: float, now: float
    ) -> None:
        self._answered()
        budget = self._budgets.get((ask.key_id, ask.resource))
        if budget is None:
            return
        if amount > 0:
            budget.granted(amount, second, used, room_in_s, now)
        else:
            budget.refused(room_in_s, used, now)

    def unanswered(self, ask: Ask) -> None:
        """The database did not answer ``ask``."""
        self._answered()
        budget = self._budgets.get((ask.key_id, ask.resource))
        if budget is not None:
            budget.asking = False

    def expired(self, now: float) -> list[Return]:
        """Leases past their use-by time, to give back; idle budgets are forgotten."""
        returns = [
            Return(key_id, resource, lease.second, lease.left)
            for (key_id, resource), budget in self._budgets.items()
            for lease in budget.expire(now)
            if lease.left > 0
        ]
        self._budgets = {
            place: budget for place, budget in self._budgets.items() if not budget.idle(now)
        }
        self._local.forget_idle(now)
        return returns

    def everything_held(self) -> list[Return]:
        """Every lease, to give back on shutdown."""
        returns: list[Return] = []
        for (key_id, resource), budget in self._budgets.items():
            returns += [
                Return(key_id, resource, lease.second, lease.left)
                for lease in budget.leases
                if lease.left > 0
            ]
            budget.leases.clear()
        return returns

    def budgets(self) -> int:
        return len(self._budgets)

    # -- helpers ----------------------------------------------------------------------------

    def _answered(self) -> None:
        self._answer.set()
        self._answer = asyncio.Event()

    def _budget(self, key_id: str, resource: str, limit: int) -> Budget:
        budget = self._budgets.get((key_id, resource))
        if budget is None:
            budget = self._budgets[(key_id, resource)] = Budget(limit)
        budget.limit = limit
        return budget

    def _local_share(
        self, key_id: str, rpm: int | None, tpm: int | None, now: float
    ) -> RateDecision:
        self.fallbacks += 1
        share = max(1, self.gateways)
        return self._local.admit(
            key_id,
            rpm=None if rpm is None else max(1, rpm // share),
            tpm=None if tpm is None else max(1, tpm // share),
            now=now,
        )

    def _decision(
        self,
        allowed: bool,
        retry_after_s: float,
        key_id: str,
        rpm: int | None,
        tpm: int | None,
        now: float,
        reserved: int = 0,
    ) -> RateDecision:
        requests = self._budgets.get((key_id, REQUESTS)) if rpm is not None else None
        tokens = self._budgets.get((key_id, TOKENS)) if tpm is not None else None
        return RateDecision(
            allowed=allowed,
            retry_after_s=retry_after_s,
            requests=None if requests is None else requests.quota(now),
            tokens=None if tokens is None else tokens.quota(now),
            reserved_tokens=reserved,
        )
