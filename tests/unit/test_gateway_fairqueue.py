"""The waiting line serves keys in turn, and each key first come, first served."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.gateway.fairqueue import FairQueue

KEYS = st.sampled_from(["alice", "bob", "carol", "dave"])


def test_one_busy_key_does_not_starve_another() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(3):
        queue.push("alice", f"alice-{n}")
    queue.push("bob", "bob-0")
    assert [queue.pop() for _ in range(4)] == ["alice-0", "bob-0", "alice-1", "alice-2"]
    assert not queue
    with pytest.raises(IndexError):
        queue.pop()


def test_a_key_that_comes_back_joins_the_end_of_the_round() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("alice", "a0")
    queue.push("bob", "b0")
    assert queue.pop() == "a0"
    queue.push("alice", "a1")
    queue.push("carol", "c0")
    assert [queue.pop() for _ in range(3)] == ["b0", "a1", "c0"]


def test_a_waiter_that_gives_up_leaves_the_line() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("alice", "a0")
    queue.push("alice", "a1")
    assert queue.remove("alice", "a0")
    assert not queue.remove("alice", "a0")
    assert not queue.remove("nobody", "a0")
    assert len(queue) == 1
    assert queue.remove("alice", "a1")
    assert len(queue) == 0
    assert list(queue) == []


def test_pop_first_skips_heads_that_cannot_be_served_and_keeps_their_turn() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("alice", "a0")
    queue.push("bob", "b0")
    queue.push("bob", "b1")
    assert queue.pop_first(lambda item: "ok" if item.startswith("b") else None) == ("b0", "ok")
    assert queue.pop_first(lambda item: None) is None
    assert queue.pop() == "a0"  # alice kept her place at the front
    assert queue.pop() == "b1"


def test_pop_first_passes_over_a_passable_waiter_to_the_next_in_its_line() -> None:
    queue: FairQueue[str] = FairQueue()
    for item in ("a-picky", "a-blocked", "a-plain"):
        queue.push("alice", item)
    queue.push("bob", "b0")

    def serves(item: str) -> str | None:
        return "ok" if item == "a-plain" else None

    # A waiter that is not passable keeps the ones behind it waiting.
    assert queue.pop_first(serves, lambda item: item == "a-picky") is None
    assert queue.pop_first(serves, lambda item: item != "a-plain") == ("a-plain", "ok")
    assert list(queue) == ["b0", "a-picky", "a-blocked"]  # alice went to the back of the round
    assert queue.pop() == "b0"
    assert queue.pop() == "a-picky"


@settings(max_examples=300)
@given(st.lists(st.one_of(KEYS, st.none()), max_size=60))
def test_no_key_is_served_twice_while_another_waits_its_turn(
    operations: list[str | None],
) -> None:
    """A key is a push, ``None`` a pop. While a key waits continuously, no other key is
    served twice between two turns of it."""
    queue: FairQueue[tuple[str, int]] = FairQueue()
    pushed: dict[str, int] = {}
    served: dict[str, int] = {}
    # For every key with waiters: how often each other key was served since its last turn.
    since_turn: dict[str, dict[str, int]] = {}
    for operation in operations:
        if operation is not None:
            queue.push(operation, (operation, pushed.get(operation, 0)))
            pushed[operation] = pushed.get(operation, 0) + 1
            since_turn.setdefault(operation, {})
            continue
        if not queue:
            continue
        key, number = queue.pop()
        assert number == served.get(key, 0), "first come, first served within a key"
        served[key] = number + 1
        since_turn[key] = {}
        for other, counts in since_turn.items():
            if other != key:
                counts[key] = counts.get(key, 0) + 1
                assert counts[key] <= 1, f"{key} served twice while {other} waited"
        if served[key] == pushed[key]:
            del since_turn[key]
    assert len(queue) == sum(pushed.values()) - sum(served.values())
