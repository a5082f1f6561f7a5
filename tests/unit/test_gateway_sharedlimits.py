"""Leasing a key's budget: the pure side (``app.gateway.sharedlimits``), on a fixed clock.

The database is played by ``Ledger``: the same rule as ``app.store.rate_budgets`` (what the
last 61 seconds granted, against the limit), kept in a dict. The PostgreSQL side of it is
tested in tests/integration/test_rate_budgets.py.
"""

from __future__ import annotations

import math

from app.gateway.ratelimit import RateDecision
from app.gateway.request_body import DEFAULT_OUTPUT_TOKENS, parse_fields, token_estimate
from app.gateway.sharedlimits import (
    GRANT_ANSWER_WITHIN_S,
    LEASE_HOLD_S,
    REQUESTS,
    TOKENS,
    Ask,
    SharedLimiter,
)

KEY = "key-1"


class Ledger:
    """What ``rate_budgets`` does, per second, for one key."""

    def __init__(self) -> None:
        self.granted: dict[tuple[str, int], int] = {}

    def used(self, resource: str, now: float) -> int:
        second = math.floor(now)
        return sum(
            amount
            for (kind, at), amount in self.granted.items()
            if kind == resource and at >= second - 60
        )

    def answer(self, limiter: SharedLimiter, ask: Ask, now: float) -> None:
        second = math.floor(now)
        amount = max(0, min(ask.want, ask.limit - self.used(ask.resource, now)))
        if amount:
            self.granted[(ask.resource, second)] = (
                self.granted.get((ask.resource, second), 0) + amount
            )
        limiter.granted(ask, amount, second, self.used(ask.resource, now), 1.0, now)

    def serve(self, limiter: SharedLimiter, now: float) -> None:
        for ask in limiter.asks(now):
            self.answer(limiter, ask, now)
        for back in limiter.expired(now):
            self.granted[(back.resource, back.second)] -= back.amount


def admit(
    limiter: SharedLimiter, now: float, rpm: int | None = 600, tpm: int | None = None
) -> bool:
    return limiter.admit(KEY, rpm=rpm, tpm=tpm, now=now).allowed


def test_the_first_request_goes_through_on_credit_and_the_grant_pays_for_it() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    asked: list[int] = []
    limiter.on_ask(lambda: asked.append(1))
    assert admit(limiter, 100.0)
    assert asked, "an empty budget asks for a slice at once"
    ledger.serve(limiter, 100.001)
    assert ledger.used(REQUESTS, 100.001) >= 1, "the credit was paid from a grant"


def test_slices_grow_with_the_keys_rate_and_stay_within_a_share_of_the_limit() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    wants: list[int] = []
    now = 100.0
    for _ in range(2000):  # 100 requests a second for 20 s
        admit(limiter, now, rpm=60_000)
        for ask in limiter.asks(now):
            wants.append(ask.want)
            ledger.answer(limiter, ask, now)
        now += 0.01
    assert wants[0] <= 2, "the credit taken and one request ahead"
    assert max(wants) <= 600, "at most 1 % of the limit"
    assert max(wants) >= 40, "about half a second of the key's rate at a time"


def test_four_gateways_admit_no_more_than_the_limit_over_a_minute() -> None:
    """Each gateway's clients ask four times a second: 960 a minute against 600."""
    ledger = Ledger()
    gateways = [SharedLimiter() for _ in range(4)]
    admitted = 0
    now = 1000.0
    for step in range(60 * 4):
        for number, gateway in enumerate(gateways):
            at = now + step * 0.25 + number * 0.01
            admitted += admit(gateway, at)
            ledger.serve(gateway, at + 0.001)
    assert 570 <= admitted <= 600 + 4, admitted


def test_a_refused_grant_stops_credit_until_it_may_ask_again() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    ledger.granted[(REQUESTS, 100)] = 10  # another gateway took the whole minute
    assert admit(limiter, 100.0, rpm=10), "credit: nothing was refused yet"
    ledger.serve(limiter, 100.0)
    refused = limiter.admit(KEY, rpm=10, tpm=None, now=100.1)
    assert not refused.allowed
    assert refused.retry_after_s > 0
    assert refused.requests is not None
    assert refused.requests.remaining == 0
    assert not admit(limiter, 100.2, rpm=10), "still in debt for the first one"


def test_the_headers_count_the_request_taken_on_credit() -> None:
    first = SharedLimiter().admit(KEY, rpm=10, tpm=None, now=100.0)
    assert first.allowed
    assert first.requests is not None
    assert first.requests.remaining == 9, "the request itself is one of the ten"
    assert first.requests.reset_s > 0, "what it took comes back within the minute"


def spend_the_minute(limiter: SharedLimiter, room_in_s: float) -> None:
    """An idle key of rpm 2: the first request on credit, then a grant of both."""
    assert admit(limiter, 100.0, rpm=2)
    (ask,) = limiter.asks(100.0)
    limiter.granted(ask, 2, 100, 2, room_in_s, 100.0)


def test_a_refusal_says_when_the_keys_minute_has_room_again() -> None:
    limiter = SharedLimiter()
    spend_the_minute(limiter, room_in_s=40.5)
    assert admit(limiter, 100.1, rpm=2), "the second of the grant"
    refused = limiter.admit(KEY, rpm=2, tpm=None, now=100.2)
    assert not refused.allowed
    assert math.isclose(refused.retry_after_s, 40.3), "not when the gateway asks again"
    assert refused.requests is not None
    assert refused.requests.remaining == 0
    assert math.isclose(refused.requests.reset_s, 40.3)


def test_no_credit_is_given_until_the_spent_minute_has_room() -> None:
    limiter = SharedLimiter()
    spend_the_minute(limiter, room_in_s=60.5)
    assert admit(limiter, 100.1, rpm=2)
    assert not admit(limiter, 102.0, rpm=2), "a third request in the minute of rpm 2"
    assert not admit(limiter, 160.0, rpm=2)
    assert admit(limiter, 160.6, rpm=2), "the grant aged out: credit again"


def test_unused_leases_go_back_after_their_hold() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    now = 100.0
    for _ in range(40):  # 20 a second for 2 s: slices of several requests
        admit(limiter, now)
        ledger.serve(limiter, now)
        now += 0.05
    held = ledger.used(REQUESTS, now)
    assert held > 40, "it holds more than it used"
    ledger.serve(limiter, now + LEASE_HOLD_S + 0.01)
    assert ledger.used(REQUESTS, now + LEASE_HOLD_S + 0.01) == 40


def test_shutdown_gives_back_everything_held() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    for step in range(20):
        admit(limiter, 100.0 + step * 0.05)
        ledger.serve(limiter, 100.0 + step * 0.05)
    for back in limiter.everything_held():
        ledger.granted[(back.resource, back.second)] -= back.amount
    assert ledger.used(REQUESTS, 101.0) == 20


def test_tokens_are_reserved_at_admission_and_settled_after() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    decision = limiter.admit(KEY, rpm=None, tpm=10_000, now=100.0, tokens=500)
    assert decision.allowed
    assert decision.reserved_tokens == 500
    ledger.serve(limiter, 100.0)
    assert ledger.used(TOKENS, 100.0) >= 500
    # The answer used 120 tokens: charged, then the reservation goes back.
    limiter.record_tokens(KEY, 120, now=100.5)
    limiter.record_tokens(KEY, 0, now=100.5, reserved=500)
    ledger.serve(limiter, 100.5)
    ledger.serve(limiter, 100.5 + LEASE_HOLD_S + 0.01)
    assert ledger.used(TOKENS, 103.0) == 120


def test_an_answer_that_outlasts_a_minute_is_charged_when_it_ends() -> None:
    """A stream of 90 s from a key that sends nothing else meanwhile: its budget holds
    nothing and was last used a minute ago, yet its request is still open, and what it
    generated is charged when it ends, not lost with a budget forgotten as idle."""
    limiter, ledger = SharedLimiter(), Ledger()
    assert limiter.admit(KEY, rpm=None, tpm=10_000, now=100.0, tokens=300).allowed
    now = 100.0
    while now < 190.0:  # the keeper's rounds while the answer streams
        ledger.serve(limiter, now)
        now += 0.5
    limiter.record_tokens(KEY, 5000, now=190.0)
    limiter.record_tokens(KEY, 0, now=190.0, reserved=300)
    ledger.serve(limiter, 190.0)
    assert not limiter.admit(KEY, rpm=None, tpm=10_000, now=190.1, tokens=9000).allowed
    ledger.serve(limiter, 190.1 + LEASE_HOLD_S + 0.01)
    # The 300 reserved counted from admission on; the rest of the 5000 from its end.
    assert ledger.used(TOKENS, 193.0) == 5000 - 300


def test_what_an_answer_longer_than_a_minute_left_of_its_reservation_is_not_given_back() -> None:
    """Its reservation counted for the minute after its admission and no longer: what it
    did not use is gone with that minute, not tokens the next request may use uncounted."""
    limiter, ledger = SharedLimiter(), Ledger()
    assert limiter.admit(KEY, rpm=None, tpm=10_000, now=100.0, tokens=4000).allowed
    now = 100.0
    while now < 190.0:
        ledger.serve(limiter, now)
        now += 0.5
    limiter.record_tokens(KEY, 3000, now=190.0)
    limiter.record_tokens(KEY, 0, now=190.0, reserved=4000)
    ledger.serve(limiter, 190.0)
    assert limiter.admit(KEY, rpm=None, tpm=10_000, now=190.1, tokens=1000).allowed
    ledger.serve(limiter, 190.1)
    ledger.serve(limiter, 190.1 + LEASE_HOLD_S + 0.01)
    assert ledger.used(TOKENS, 193.0) == 1000, "the next request is counted whole"


def test_a_count_below_zero_gives_back_no_more_than_was_reserved() -> None:
    """A caller that settles a negative count (or reservation) hands no tokens to the
    key: what goes back to the database is never more than it granted less what was used."""
    limiter, ledger = SharedLimiter(), Ledger()
    assert limiter.admit(KEY, rpm=None, tpm=10_000, now=100.0, tokens=500).allowed
    ledger.serve(limiter, 100.0)
    limiter.record_tokens(KEY, -1_000_000, now=100.5)
    limiter.record_tokens(KEY, -1_000_000, now=100.5, reserved=500)
    limiter.record_tokens(KEY, 120, now=100.5, reserved=-1_000_000)
    for back in limiter.everything_held():
        ledger.granted[(back.resource, back.second)] -= back.amount
    assert ledger.used(TOKENS, 101.0) == 120, "the reservation back, the 120 used charged"


def test_a_request_that_does_not_fit_the_tokens_left_is_refused() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    assert limiter.admit(KEY, rpm=None, tpm=1000, now=100.0, tokens=900).allowed
    ledger.serve(limiter, 100.0)
    assert not limiter.admit(KEY, rpm=None, tpm=1000, now=100.1, tokens=900).allowed


def test_while_degraded_it_uses_what_it_holds_then_its_local_share() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    limiter.gateways = 4
    now = 100.0
    for _ in range(20):
        admit(limiter, now, rpm=600)
        ledger.serve(limiter, now)
        now += 0.05
    held = sum(amount for amount in ledger.granted.values()) - 20
    limiter.degraded = True
    admitted = sum(admit(limiter, now + i * 0.001, rpm=600) for i in range(400))
    assert admitted == held + 600 // 4
    assert limiter.fallbacks > 0


def test_a_burst_beyond_the_credit_waits_for_the_grant_on_its_way_rather_than_a_429() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    assert admit(limiter, 100.0, rpm=120)
    second = limiter.admit(KEY, rpm=120, tpm=None, now=100.001)
    assert not second.allowed
    assert second.pending, "a grant is wanted: the request may wait for it"
    ledger.serve(limiter, 100.002)
    assert admit(limiter, 100.003, rpm=120)


def test_nothing_is_pending_once_the_minute_is_spent() -> None:
    limiter, ledger = SharedLimiter(), Ledger()
    ledger.granted[(REQUESTS, 100)] = 120
    assert admit(limiter, 100.0, rpm=120)
    ledger.serve(limiter, 100.0)
    refused = limiter.admit(KEY, rpm=120, tpm=None, now=100.01)
    assert not refused.allowed
    assert not refused.pending


def test_a_reservation_is_at_most_the_whole_limit() -> None:
    limiter = SharedLimiter()
    decision = limiter.admit(KEY, rpm=None, tpm=1000, now=100.0, tokens=10**30)
    assert decision.allowed
    assert decision.reserved_tokens == 1000


def test_the_estimate_is_the_prompts_bytes_over_four_and_the_most_the_request_may_generate() -> (
    None
):
    def estimate(body: bytes) -> int:
        return token_estimate(parse_fields(body), len(body), generates=True)

    prompt = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 400 + b'"}]'
    assert estimate(prompt + b',"max_tokens":12}') == len(prompt + b',"max_tokens":12}') // 4 + 12
    both = prompt + b',"max_completion_tokens":7,"max_tokens":12}'
    assert estimate(both) == len(both) // 4 + 7
    assert estimate(prompt + b"}") == (len(prompt) + 1) // 4 + DEFAULT_OUTPUT_TOKENS
    for hostile in (b'"x"', b"-5", b"1e400", b'{"a":[1]}', b"null", b"true"):
        body = prompt + b',"max_tokens":' + hostile + b"}"
        assert estimate(body) == len(body) // 4 + DEFAULT_OUTPUT_TOKENS, hostile


def test_a_key_that_went_into_debt_is_served_again_once_its_minute_has_room() -> None:
    """An answer larger than the room left takes the key into debt, which a grant pays;
    one asked for while the minute is spent is refused. The budget stopped asking once
    the key had been idle for ``LEASE_HOLD_S``, so the debt was never paid: every later
    request of the key was refused ("retry after 0.1 s"), on that gateway, for good."""
    limiter, ledger = SharedLimiter(), Ledger()

    def ask(tokens: int, now: float) -> bool:
        return limiter.admit(KEY, rpm=None, tpm=1000, now=now, tokens=tokens).allowed

    assert ask(900, 100.0)
    ledger.serve(limiter, 100.0)
    limiter.record_tokens(KEY, 900, now=104.0, reserved=900)
    # The last grant's word on the minute's room is old: the next one goes on credit.
    assert ask(500, 105.0)
    ledger.serve(limiter, 105.0)  # the minute is spent: the grant pays only part of it
    limiter.record_tokens(KEY, 500, now=108.0, reserved=500)
    for second in range(109, 180):  # the keeper runs on; the key sends nothing
        ledger.serve(limiter, float(second))

    now, served = 180.0, False
    for _ in range(5):  # each refusal with the grant it asked for answered
        served = ask(500, now)
        if served:
            break
        ledger.serve(limiter, now + 0.01)
        now += 0.05
    assert served, "the minute has room: nothing of the key's is in it any more"
    # Every token the key used reached the database: its debt came with a grant.
    assert sum(ledger.granted.values()) >= 900 + 500


def test_a_request_larger_than_the_room_told_waits_until_the_credit_may_cover_it() -> None:
    """Another gateway holds most of the key's minute: the last grant left less room than
    the request needs, so it is refused until that word on the room is old (when credit
    covers it). It was told "Retry after 0.1 s" (retry-after-ms: 50), and a client that
    honoured it was refused again some twenty times in that second."""
    limiter, ledger = SharedLimiter(), Ledger()
    ledger.granted[(TOKENS, 50)] = 800  # another gateway's grant, 50 s ago

    def ask(tokens: int, now: float) -> RateDecision:
        return limiter.admit(KEY, rpm=None, tpm=1000, now=now, tokens=tokens)

    assert ask(100, 100.0).allowed, "on credit: the minute's room is not known yet"
    ledger.serve(limiter, 100.0)  # the grant pays it and leaves 90 of the minute
    refused = ask(300, 100.1)
    assert not refused.allowed
    assert not refused.pending
    assert refused.retry_after_s >= 0.85, refused.retry_after_s
    assert not ask(300, 100.1 + refused.retry_after_s - 0.01).allowed, "never less"
    assert ask(300, 100.1 + refused.retry_after_s).allowed, "admitted at the first try"


def test_a_request_refused_while_its_debts_grant_is_unanswered_waits_for_the_answer() -> None:
    """A debt beyond one slice is paid only by a grant; while the database is slow to
    answer it, a refusal said "Retry after 0.1 s" (retry-after-ms: 50), again and again
    until it answered."""
    limiter, ledger = SharedLimiter(), Ledger()

    def ask(now: float) -> RateDecision:
        return limiter.admit(KEY, rpm=None, tpm=2000, now=now, tokens=400)

    assert ask(100.0).allowed
    limiter.record_tokens(KEY, 900, now=100.1, reserved=400)  # it generated more
    (grant,) = limiter.asks(100.1)  # asked for; the answer is slow to come
    refused = ask(100.4)
    assert not refused.allowed
    assert refused.retry_after_s >= GRANT_ANSWER_WITHIN_S - 0.3 - 1e-9, refused.retry_after_s
    ledger.answer(limiter, grant, 101.5)  # the minute's room pays the debt
    assert ask(100.4 + refused.retry_after_s).allowed, "admitted at the first try"


def test_a_debt_beyond_the_limit_is_told_the_minutes_it_takes_to_pay() -> None:
    """An answer three times the key's tpm: grants pay at most the limit a minute, so the
    key is served again only once two more minutes have paid for it. A refusal said when
    the first of them began, and the client that came back then was refused again."""
    limiter = SharedLimiter()

    def ask(now: float) -> RateDecision:
        return limiter.admit(KEY, rpm=None, tpm=1000, now=now, tokens=5)

    assert limiter.admit(KEY, rpm=None, tpm=1000, now=100.0, tokens=1000).allowed
    (grant,) = limiter.asks(100.0)
    limiter.granted(grant, 1000, 100, 1000, 61.0, 100.0)  # the minute is spent
    limiter.record_tokens(KEY, 3000, now=110.0, reserved=1000)  # 2000 beyond it
    refused = ask(110.5)
    assert not refused.allowed
    assert refused.retry_after_s >= 161.0 + 2 * 60 - 110.5, refused.retry_after_s
    assert refused.retry_after_s <= 161.0 + 2 * 61 - 110.5, "no more than the ledger's count"


def test_what_the_gateway_gave_back_of_a_spent_minute_can_be_used_again() -> None:
    """A key of rpm 2 idle until then: its first request's grant takes the whole minute
    (the request and one ahead), and the unused one goes back 2 s later. A second request
    20 s after the first was refused, "Retry after 41 s", with the minute half empty: the
    budget held the minute for spent until its grant aged out, and did not ask again."""
    limiter, ledger = SharedLimiter(), Ledger()
    assert admit(limiter, 100.0, rpm=2)
    (ask,) = limiter.asks(100.0)
    ledger.granted[(REQUESTS, 100)] = 2
    limiter.granted(ask, 2, 100, 2, 61.0, 100.0)  # the minute is spent: one held
    for back in limiter.expired(100.0 + LEASE_HOLD_S):
        ledger.granted[(back.resource, back.second)] -= back.amount
    assert ledger.used(REQUESTS, 120.0) == 1
    assert admit(limiter, 120.0, rpm=2), "the minute has room for one more"
    ledger.serve(limiter, 120.0)
    assert ledger.used(REQUESTS, 120.0) == 2
    assert not admit(limiter, 120.1, rpm=2), "and for no more than that"


def test_a_refused_key_asks_again_for_what_other_gateways_gave_back() -> None:
    """The page's promise: while a key's minute is spent, the gateway asks the database
    again within a second, as other gateways may give back what they hold sooner. It did
    not once the key had taken nothing for ``LEASE_HOLD_S``: its refused requests were
    refused until the minute's oldest grant aged out, with the room given back unused."""
    limiter, ledger = SharedLimiter(), Ledger()
    ledger.granted[(REQUESTS, 100)] = 3  # another gateway's slice
    assert admit(limiter, 100.0, rpm=4), "on credit"
    (ask,) = limiter.asks(100.0)
    ledger.granted[(REQUESTS, 100)] += 1
    limiter.granted(ask, 1, 100, 4, 61.0, 100.0)  # the last of the minute
    ledger.granted[(REQUESTS, 100)] -= 3  # the other gateway gives its slice back
    refused = limiter.admit(KEY, rpm=4, tpm=None, now=105.0)
    assert not refused.allowed
    assert refused.pending, "a grant is asked for: the request may wait for it"
    ledger.serve(limiter, 105.0)
    assert admit(limiter, 105.01, rpm=4)
