"""The hub's handshake gate: each address may have so many TLS handshakes in progress; one
more is refused and counted, and an ended handshake frees its place."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.hub.gate import DEFAULT_PER_ADDRESS, MAX_PER_ADDRESS, HandshakeGate

FLOODER = "127.0.0.66"
AGENT = "127.0.0.2"


def test_an_address_at_its_cap_is_refused_and_counted_while_another_gets_in() -> None:
    gate = HandshakeGate(per_address=3)

    assert [gate.enter(FLOODER) for _ in range(5)] == [True, True, True, False, False]
    assert gate.enter(AGENT)

    assert gate.refused == 2
    assert (gate.in_progress(FLOODER), gate.in_progress(AGENT)) == (3, 1)


def test_a_handshake_that_ends_frees_its_place() -> None:
    gate = HandshakeGate(per_address=1)
    assert gate.enter(FLOODER)
    assert not gate.enter(FLOODER)

    gate.leave(FLOODER)

    assert gate.enter(FLOODER)
    assert gate.refused == 1


def test_an_address_without_handshakes_is_forgotten() -> None:
    gate = HandshakeGate()
    for _ in range(DEFAULT_PER_ADDRESS):
        gate.enter(FLOODER)
    for _ in range(DEFAULT_PER_ADDRESS):
        gate.leave(FLOODER)

    assert gate.addresses() == 0
    gate.leave(FLOODER)  # one too many, as a connection lost twice would: nothing breaks
    assert gate.in_progress(FLOODER) == 0


def test_the_addresses_of_one_ipv6_slash_64_share_one_cap() -> None:
    # Counted one by one, a host with a /64 (2^64 addresses) was not capped at all.
    gate = HandshakeGate(per_address=2)
    flooder = [f"2001:db8:0:7::{n:x}" for n in range(1, 5)]

    admitted = [gate.enter(address) for address in flooder]

    assert admitted == [True, True, False, False]
    assert gate.enter("2001:db8:0:8::1")  # the next /64 is another host
    assert (gate.in_progress("2001:db8:0:7:ffff::9"), gate.addresses()) == (2, 2)
    gate.leave(flooder[0])
    assert gate.enter(flooder[3])


def test_an_ipv4_mapped_address_counts_as_its_ipv4_address_and_ipv4_alone() -> None:
    gate = HandshakeGate(per_address=1)

    assert gate.enter("192.0.2.7")
    assert not gate.enter("::ffff:192.0.2.7")
    assert gate.enter("192.0.2.8")  # its neighbour is not grouped with it
    assert gate.refused == 1


@pytest.mark.parametrize("per_address", [0, -1, MAX_PER_ADDRESS + 1])
def test_a_cap_outside_its_bounds_is_refused(per_address: int) -> None:
    with pytest.raises(ValueError, match=f"between 1 and {MAX_PER_ADDRESS}, not {per_address}"):
        HandshakeGate(per_address)


@given(st.integers(min_value=1, max_value=5), st.lists(st.booleans(), max_size=60))
def test_never_more_than_the_cap_in_progress_and_every_refusal_counted(
    cap: int, steps: list[bool]
) -> None:
    """``steps``: True, a connection arrives; False, the oldest in progress ends."""
    gate = HandshakeGate(cap)
    in_progress = refused = 0
    for arrives in steps:
        if arrives:
            admitted = gate.enter(FLOODER)
            assert admitted == (in_progress < cap)
            in_progress += admitted
            refused += not admitted
        elif in_progress:
            gate.leave(FLOODER)
            in_progress -= 1
        assert gate.in_progress(FLOODER) == in_progress <= cap
    assert gate.refused == refused
