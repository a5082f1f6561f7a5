"""Requests and tokens per minute, per key, over a sliding window."""

from __future__ import annotations

import copy
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.gateway.ratelimit import WINDOW_S, RateLimiter, SlidingCount

T0 = 6000.0  # the start of a fixed bucket


def test_a_key_without_limits_is_never_counted() -> None:
    limiter = RateLimiter()
    for _ in range(1000):
        decision = limiter.admit("k", rpm=None, tpm=None, now=T0)
        assert decision.allowed
        assert decision.requests is None
        assert decision.tokens is None
    assert limiter.tracked_keys() == 0


def test_requests_over_the_limit_wait_for_the_window_to_slide() -> None:
    limiter = RateLimiter()
    for n in range(3):
        decision = limiter.admit("k", rpm=3, tpm=None, now=T0 + n)
        assert decision.allowed
        assert decision.requests is not None
        assert decision.requests.remaining == 2 - n
    refused = limiter.admit("k", rpm=3, tpm=None, now=T0 + 10)
    assert not refused.allowed
    # Three over [T0, T0+2]: one more fits once a third of that span has left the window.
    assert math.isclose(refused.retry_after_s, 60 + 2 / 3 - 10)
    assert refused.requests is not None
    assert refused.requests.remaining == 0
    # The last of the three leaves the window a minute after it came.
    assert math.isclose(refused.requests.reset_s, 62 - 10)
    assert refused.tokens is None
    assert not limiter.admit("k", rpm=3, tpm=None, now=T0 + 60.6).allowed
    assert limiter.admit("k", rpm=3, tpm=None, now=T0 + 60.667).allowed


def test_a_burst_is_forgotten_a_window_after_it_came() -> None:
    """Three requests at the very start of a bucket: the refused fourth may come back one
    window after them, not after the two windows the fixed buckets span."""
    limiter = RateLimiter()
    for _ in range(3):
        assert limiter.admit("k", rpm=3, tpm=None, now=T0).allowed
    refused = limiter.admit("k", rpm=3, tpm=None, now=T0)
    assert refused.retry_after_s == 60.0
    assert refused.requests is not None
    assert refused.requests.reset_s == 60.0
    assert not limiter.admit("k", rpm=3, tpm=None, now=T0 + 59.999).allowed
    assert limiter.admit("k", rpm=3, tpm=None, now=T0 + 60).allowed


def test_keys_are_limited_separately() -> None:
    limiter = RateLimiter()
    assert limiter.admit("a", rpm=1, tpm=None, now=T0).allowed
    assert not limiter.admit("a", rpm=1, tpm=None, now=T0).allowed
    assert limiter.admit("b", rpm=1, tpm=None, now=T0).allowed


def test_tokens_are_charged_after_the_answer_and_stop_the_next_request() -> None:
    limiter = RateLimiter()
    first = limiter.admit("k", rpm=None, tpm=1000, now=T0)
    assert first.allowed
    assert first.tokens is not None
    assert first.tokens.remaining == 1000
    limiter.record_tokens("k", 1200, now=T0 + 1)
    refused = limiter.admit("k", rpm=None, tpm=1000, now=T0 + 2)
    assert not refused.allowed
    assert refused.retry_after_s > 58
    assert refused.tokens is not None
    assert refused.tokens.remaining == 0


def test_a_zero_limit_refuses_everything_and_says_to_ask_again_in_a_window() -> None:
    decision = RateLimiter().admit("k", rpm=0, tpm=None, now=T0)
    assert not decision.allowed
    assert decision.retry_after_s == 60.0


def test_idle_keys_are_forgotten() -> None:
    limiter = RateLimiter()
    limiter.admit("k", rpm=5, tpm=None, now=T0 + 30)
    limiter.forget_idle(T0 + 89.9)
    assert limiter.tracked_keys() == 1  # in the previous bucket, still in the window
    limiter.forget_idle(T0 + 90)
    assert limiter.tracked_keys() == 0


def test_the_previous_bucket_fades_over_the_span_its_events_took() -> None:
    count = SlidingCount(60.0)
    count.add(5, T0 + 10)
    count.add(5, T0 + 30)
    assert math.isclose(count.estimate(T0 + 60), 10)
    assert math.isclose(count.estimate(T0 + 70), 10)
    assert math.isclose(count.estimate(T0 + 80), 5)
    assert math.isclose(count.estimate(T0 + 89.999), 0, abs_tol=1e-3)
    assert count.estimate(T0 + 90) == 0


def test_events_at_one_moment_leave_the_window_together() -> None:
    count = SlidingCount(60.0)
    count.add(10, T0 + 30)
    assert math.isclose(count.estimate(T0 + 89.999), 10)
    assert count.estimate(T0 + 90) == 0


arrivals = st.lists(st.floats(0, 300, allow_nan=False), max_size=80).map(sorted)


@settings(max_examples=300)
@given(rpm=st.integers(1, 12), times=arrivals)
def test_never_more_than_the_limit_in_one_fixed_minute(rpm: int, times: list[float]) -> None:
    limiter = RateLimiter()
    admitted_per_bucket: dict[int, int] = {}
    for offset in times:
        if limiter.admit("k", rpm=rpm, tpm=None, now=T0 + offset).allowed:
            bucket = math.floor((T0 + offset) / 60)
            admitted_per_bucket[bucket] = admitted_per_bucket.get(bucket, 0) + 1
    assert all(count <= rpm for count in admitted_per_bucket.values())


@settings(max_examples=300)
@given(
    rpm=st.integers(1, 12),
    tpm=st.one_of(st.none(), st.integers(1, 500)),
    times=arrivals,
    tokens=st.integers(0, 200),
)
def test_retry_after_is_honest(rpm: int, tpm: int | None, times: list[float], tokens: int) -> None:
    """A refused request that waits exactly ``retry_after_s`` is admitted (nothing else
    having come meanwhile), and not a moment much earlier."""
    limiter = RateLimiter()
    for offset in times:
        now = T0 + offset
        decision = limiter.admit("k", rpm=rpm, tpm=tpm, now=now)
        if decision.allowed:
            limiter.record_tokens("k", tokens, now=now)
            continue
        assert decision.retry_after_s > 0
        later = copy.deepcopy(limiter)
        assert later.admit("k", rpm=rpm, tpm=tpm, now=now + decision.retry_after_s + 1e-6).allowed
        if decision.retry_after_s > 0.01:
            sooner = copy.deepcopy(limiter)
            early = now + decision.retry_after_s - 0.01
            assert not sooner.admit("k", rpm=rpm, tpm=tpm, now=early).allowed


@settings(max_examples=300)
@given(
    rpm=st.integers(1, 12),
    tpm=st.one_of(st.none(), st.integers(1, 500)),
    times=arrivals,
    tokens=st.integers(0, 200),
)
def test_what_a_refusal_advertises_is_never_more_than_the_window(
    rpm: int, tpm: int | None, times: list[float], tokens: int
) -> None:
    """``Retry-After`` and ``x-ratelimit-reset-*`` stay within the window; and once the
    reset has passed, the window holds nothing of what it counted."""
    limiter = RateLimiter()
    for offset in times:
        now = T0 + offset
        decision = limiter.admit("k", rpm=rpm, tpm=tpm, now=now)
        if decision.allowed:
            limiter.record_tokens("k", tokens, now=now)
            continue
        assert decision.retry_after_s <= WINDOW_S
        quotas = [q for q in (decision.requests, decision.tokens) if q is not None]
        assert all(0 <= quota.reset_s <= WINDOW_S for quota in quotas)
        # Once every limit's reset has passed, neither window holds anything: the request
        # is admitted and is all that counts.
        after_reset = copy.deepcopy(limiter)
        latest = max(quota.reset_s for quota in quotas)
        fresh = after_reset.admit("k", rpm=rpm, tpm=tpm, now=now + latest)
        assert fresh.allowed
        assert fresh.requests is None or fresh.requests.remaining == rpm - 1
        assert fresh.tokens is None or fresh.tokens.remaining == fresh.tokens.limit
