"""Consistent hashing with bounded loads (``app.domain.hash_ring``): keys stay where they
were when the ring changes, weights are respected, and no replica ends above its bound
however skewed the keys are."""

from __future__ import annotations

import random
from collections import Counter

from app.domain.hash_ring import HashRing, bound, key_fraction, key_hash

KEYS = [key_hash(f"conversation-{n}".encode()) for n in range(20_000)]


def replicas(count: int, weight: float = 1.0) -> list[tuple[str, float]]:
    return [(f"m-{n}", weight) for n in range(1, count + 1)]


def test_a_key_hash_is_the_same_in_every_process() -> None:
    # A fixed value: BLAKE2b, not Python's per-process salted hash().
    assert key_hash(b"system prompt") == 0x07B85427FE6F5BA4


def test_adding_a_replica_moves_about_one_nth_of_the_keys_and_only_to_it() -> None:
    before = HashRing(replicas(4))
    after = HashRing(replicas(5))
    moved = [k for k in KEYS if before.home(k) != after.home(k)]
    assert 0.14 <= len(moved) / len(KEYS) <= 0.26  # 1/5 expected
    assert {after.home(k) for k in moved} == {"m-5"}


def test_removing_a_replica_moves_only_its_own_keys() -> None:
    before = HashRing(replicas(5))
    after = HashRing([m for m in replicas(5) if m[0] != "m-3"])
    for k in KEYS:
        if before.home(k) != "m-3":
            assert after.home(k) == before.home(k)


def test_the_ring_does_not_depend_on_the_order_members_are_given_in() -> None:
    members = replicas(6)
    shuffled = members[:]
    random.Random(7).shuffle(shuffled)
    one, other = HashRing(members), HashRing(shuffled)
    assert [one.home(k) for k in KEYS[:2000]] == [other.home(k) for k in KEYS[:2000]]


def test_weights_set_each_replicas_share_of_keys() -> None:
    ring = HashRing([("heavy", 2.0), ("light-1", 1.0), ("light-2", 1.0)])
    shares = Counter(ring.home(k) for k in KEYS)
    assert 0.42 <= shares["heavy"] / len(KEYS) <= 0.58  # 1/2 expected
    assert 0.19 <= shares["light-1"] / len(KEYS) <= 0.31  # 1/4 expected


def test_a_walk_visits_every_member_once_home_first() -> None:
    ring = HashRing(replicas(5))
    for k in KEYS[:200]:
        walk = list(ring.walk(k))
        assert walk[0] == ring.home(k)
        assert sorted(walk) == sorted(ring.members)


def test_under_skewed_keys_no_replica_ends_above_its_bound() -> None:
    # A Zipf-like mix: a few keys (shared system prompts, say) carry most requests.
    rng = random.Random(11)
    hot = [key_hash(f"hot-{n}".encode()) for n in range(5)]
    members = [("m-1", 1.0), ("m-2", 1.0), ("m-3", 2.0), ("m-4", 1.0)]
    ring = HashRing(members)
    weights = dict(members)
    load_factor = 0.25
    loads: Counter[str] = Counter()

    def hot_or_cold() -> int:
        return (
            hot[min(int(rng.paretovariate(1.2)) - 1, 4)]
            if rng.random() < 0.9
            else rng.getrandbits(64)
        )

    # While requests only arrive, every replica stays within its bound at every step.
    for step in range(1500):
        pick = ring.pick(hot_or_cold(), load_of=loads.__getitem__, load_factor=load_factor)
        assert pick.member is not None
        loads[pick.member] += 1
        total = sum(loads.values())
        for member, weight in weights.items():
            assert loads[member] <= bound(total, weight, 5.0, load_factor), (step, dict(loads))
    # As they also end, the replica that takes one is within its bound once it has it.
    for _ in range(3000):
        for _ in range(rng.randrange(3)):
            loads[rng.choice([m for m in loads if loads[m] > 0])] -= 1
        pick = ring.pick(hot_or_cold(), load_of=loads.__getitem__, load_factor=load_factor)
        assert pick.member is not None
        loads[pick.member] += 1
        total = sum(loads.values())
        assert loads[pick.member] <= bound(total, weights[pick.member], 5.0, load_factor)
    # Without the bound the hottest key's home would carry most of it all.
    homes = Counter(ring.home(k) for k in hot)
    assert max(homes.values()) >= 2


def test_the_bound_passes_a_full_home_over_for_the_next_on_the_ring() -> None:
    ring = HashRing(replicas(4))
    key = KEYS[0]
    home, second = list(ring.walk(key))[:2]
    loads = Counter(
        {home: 10, second: 0, **{m: 0 for m in ring.members if m not in (home, second)}}
    )
    pick = ring.pick(key, load_of=loads.__getitem__, load_factor=0.25)
    assert (pick.member, pick.reason, pick.passed_over) == (second, "over_bound", 1)
    loads.update({m: 2 - loads[m] for m in ring.members})  # 2 each: total 8
    # Its share with this request: ceil(1.25 * 9 / 4) = 3; it carries 2, so it takes it.
    assert ring.pick(key, load_of=loads.__getitem__, load_factor=0.25) == (home, "home", 0)
    loads[home] = 4  # total 10: ceil(1.25 * 11 / 4) = 4, and 4 + 1 is over it
    assert ring.pick(key, load_of=loads.__getitem__, load_factor=0.25).member == second


def test_a_refused_replica_is_passed_over_and_all_refused_picks_none() -> None:
    ring = HashRing(replicas(3))
    key = KEYS[1]
    home, second, _third = ring.walk(key)
    idle: Counter[str] = Counter()
    pick = ring.pick(key, load_of=idle.__getitem__, load_factor=0.25, refuse={home}.__contains__)
    assert (pick.member, pick.reason) == (second, "refused")
    nobody = ring.pick(key, load_of=idle.__getitem__, load_factor=0.25, refuse=lambda m: True)
    assert (nobody.member, nobody.passed_over) == (None, 3)


def test_a_floor_under_the_bound_keeps_a_key_home_at_light_load() -> None:
    ring = HashRing(replicas(4))
    key = KEYS[2]
    home = ring.home(key)
    loads = Counter({home: 1})  # 1 in all: the formula's bound is ceil(1.25 * 2 / 4) = 1
    assert ring.pick(key, load_of=loads.__getitem__, load_factor=0.25).reason == "over_bound"
    floored = ring.pick(key, load_of=loads.__getitem__, load_factor=0.25, min_bound=4)
    assert (floored.member, floored.reason) == (home, "home")
    assert bound(1, 1.0, 4.0, 0.25, min_bound=4) == 4


def test_an_empty_ring_has_no_home() -> None:
    ring = HashRing([])
    assert ring.home(KEYS[0]) is None
    assert ring.pick(KEYS[0], load_of=lambda m: 0, load_factor=0.25).member is None


def test_absent_members_are_passed_over_and_leave_the_bounds_to_the_others() -> None:
    ring = HashRing(replicas(3))
    key = KEYS[3]
    home, second, gone = ring.walk(key)
    loads = Counter({home: 5, second: 5, gone: 0})
    # The two left carry 10: ceil(1.25 * 11 / 2) = 7 each, as on a ring of the two alone.
    pick = ring.pick(key, load_of=loads.__getitem__, load_factor=0.25, absent={gone})
    assert pick == (home, "home", 0)
    alone = HashRing([(home, 1.0), (second, 1.0)])
    assert alone.pick(key, load_of=loads.__getitem__, load_factor=0.25).member == home
    moved = ring.pick(key, load_of=loads.__getitem__, load_factor=0.25, absent={home, gone})
    assert moved == (second, "refused", 1)
    nobody = ring.pick(key, load_of=loads.__getitem__, load_factor=0.25, absent=set(ring.members))
    assert (nobody.member, nobody.passed_over) == (None, 3)


def test_a_keys_fraction_is_below_1_spread_evenly_and_unrelated_to_its_ring_position() -> None:
    fractions = [key_fraction(key) for key in KEYS]
    assert all(0.0 <= f < 1.0 for f in fractions)
    assert key_fraction(2**64 - 1) < 1.0
    assert 0.48 < sum(f < 0.5 for f in fractions) / len(KEYS) < 0.52
    # The keys of the ring's first half draw below 0.5 as often as the others do.
    first_half = [f for key, f in zip(KEYS, fractions, strict=True) if key < 2**63]
    assert 0.47 < sum(f < 0.5 for f in first_half) / len(first_half) < 0.53
