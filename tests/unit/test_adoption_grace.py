"""The adoption grace follows the fleet: a stream of arrivals keeps it open, a quiet period
ends it, the upper bound ends it, and every known node back ends it at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.domain.adoption_grace import AdoptionGrace, Arrivals, GraceState, grace_state

STARTED = datetime(2026, 1, 1, tzinfo=UTC)
GRACE = AdoptionGrace(minimum_s=30, quiet_s=10, maximum_s=600)
FLEET = [f"gpu-{n}" for n in range(3)]


def at(seconds: float) -> datetime:
    return STARTED + timedelta(seconds=seconds)


def state(
    now_s: float,
    *,
    said_hello: list[str] | None = None,
    last_hello_s: float | None = None,
    opening: int = 0,
    grace: AdoptionGrace = GRACE,
) -> GraceState:
    return grace_state(
        grace,
        started_at=STARTED,
        now=at(now_s),
        expected=FLEET,
        said_hello=said_hello or [],
        arrivals=Arrivals(
            last_hello_at=None if last_hello_s is None else at(last_hello_s),
            connections_opening=opening,
        ),
    )


def test_the_grace_is_open_for_its_least_length_even_when_nothing_arrives() -> None:
    assert state(29.9) is GraceState.OPEN
    assert state(30) is GraceState.QUIET


def test_a_stream_of_hellos_keeps_the_grace_open_past_its_least_length() -> None:
    hellos: list[str] = []
    for second in range(0, 300, 9):  # a hello every 9 s, less than the quiet period
        assert state(second, said_hello=hellos, last_hello_s=second - 9) is GraceState.OPEN
    assert state(300, said_hello=hellos, last_hello_s=297) is GraceState.OPEN


def test_a_quiet_period_after_the_last_hello_ends_the_grace() -> None:
    back = ["gpu-0", "gpu-1"]
    assert state(50, said_hello=back, last_hello_s=40.1) is GraceState.OPEN
    assert state(50, said_hello=back, last_hello_s=40) is GraceState.QUIET


def test_connections_still_opening_keep_the_grace_open_before_any_hello() -> None:
    """A storm of TLS handshakes can hold the first hello back past the least grace."""
    assert state(100, opening=2_500) is GraceState.OPEN
    assert state(101, opening=0) is GraceState.QUIET


def test_the_upper_bound_ends_the_grace_whatever_still_arrives() -> None:
    assert state(599.9, last_hello_s=599, opening=10) is GraceState.OPEN
    assert state(600, last_hello_s=599.5, opening=10) is GraceState.BOUND


def test_the_bound_is_never_shorter_than_the_least_grace() -> None:
    long_least = AdoptionGrace(minimum_s=900, quiet_s=10, maximum_s=600)
    assert state(700, grace=long_least) is GraceState.OPEN
    assert state(900, grace=long_least) is GraceState.BOUND


def test_every_known_node_back_ends_the_grace_at_once() -> None:
    assert state(1, said_hello=FLEET, last_hello_s=1, opening=5) is GraceState.ALL_BACK


def test_a_fleet_the_log_does_not_know_has_no_grace() -> None:
    ended = grace_state(
        GRACE, started_at=STARTED, now=STARTED, expected=[], said_hello=[], arrivals=Arrivals()
    )
    assert ended is GraceState.ALL_BACK


def test_once_ended_the_grace_never_opens_again_in_the_term() -> None:
    fresh = Arrivals(last_hello_at=at(45), connections_opening=3)
    assert (
        grace_state(
            GRACE, started_at=STARTED, now=at(46), expected=FLEET, said_hello=[], arrivals=fresh
        )
        is GraceState.OPEN
    )
    ended = grace_state(
        GRACE,
        started_at=STARTED,
        now=at(46),
        expected=FLEET,
        said_hello=[],
        arrivals=fresh,
        ended=True,
    )
    assert ended is GraceState.ENDED


def test_within_its_least_length_the_grace_is_judged_afresh_at_every_pass() -> None:
    """Every node back ended it at 1 s; at 5 s the log knows one more that has not said
    hello here (it registered a moment ago): it is waited for until the least length is
    over, as a fixed grace did, and only then does the ended grace stay ended."""
    arrivals = Arrivals(last_hello_at=at(1))
    assert (
        grace_state(
            GRACE,
            started_at=STARTED,
            now=at(5),
            expected=[*FLEET, "gpu-new"],
            said_hello=FLEET,
            arrivals=arrivals,
            ended=True,
        )
        is GraceState.OPEN
    )
    assert (
        grace_state(
            GRACE,
            started_at=STARTED,
            now=at(GRACE.minimum_s),
            expected=[*FLEET, "gpu-new"],
            said_hello=FLEET,
            arrivals=arrivals,
            ended=True,
        )
        is GraceState.ENDED
    )
