"""Weighted rendezvous hashing with bounded loads (``app.domain.rendezvous``): keys stay
where they were when the members or their weights change, save those that must move,
weights are respected at any scale, every process walks a key the same way, and no replica
ends above its bound however skewed the keys are."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import subprocess
import sys
from collections import Counter

from app.domain.rendezvous import Rendezvous, bound, key_fraction, key_hash, mix64

KEYS = [key_hash(f"conversation-{n}".encode()) for n in range(20_000)]


def replicas(count: int, weight: float = 1.0) -> list[tuple[str, float]]:
    return [(f"m-{n}", weight) for n in range(1, count + 1)]


def test_a_key_hash_is_the_same_in_every_process() -> None:
    # A fixed value: BLAKE2b, not Python's per-process salted hash().
    assert key_hash(b"system prompt") == 0x07B85427FE6F5BA4


def test_adding_a_replica_moves_about_one_nth_of_the_keys_and_only_to_it() -> None:
    before = Rendezvous(replicas(4))
    after = Rendezvous(replicas(5))
    moved = [k for k in KEYS if before.home(k) != after.home(k)]
    assert 0.14 <= len(moved) / len(KEYS) <= 0.26  # 1/5 expected
    assert {after.home(k) for k in moved} == {"m-5"}


def test_removing_a_replica_moves_only_its_own_keys() -> None:
    before = Rendezvous(replicas(5))
    after = Rendezvous([m for m in replicas(5) if m[0] != "m-3"])
    for k in KEYS:
        if before.home(k) != "m-3":
            assert after.home(k) == before.home(k)


def test_the_walks_do_not_depend_on_the_order_members_are_given_in() -> None:
    members = replicas(6)
    shuffled = members[:]
    random.Random(7).shuffle(shuffled)
    one, other = Rendezvous(members), Rendezvous(shuffled)
    assert [one.home(k) for k in KEYS[:2000]] == [other.home(k) for k in KEYS[:2000]]


def test_weights_set_each_replicas_share_of_keys() -> None:
    rendezvous = Rendezvous([("heavy", 2.0), ("light-1", 1.0), ("light-2", 1.0)])
    shares = Counter(rendezvous.home(k) for k in KEYS)
    assert 0.42 <= shares["heavy"] / len(KEYS) <= 0.58  # 1/2 expected
    assert 0.19 <= shares["light-1"] / len(KEYS) <= 0.31  # 1/4 expected


def test_a_walk_visits_every_member_once_home_first() -> None:
    rendezvous = Rendezvous(replicas(5))
    for k in KEYS[:200]:
        walk = list(rendezvous.walk(k))
        assert walk[0] == rendezvous.home(k)
        assert sorted(walk) == sorted(rendezvous.members)


def test_under_skewed_keys_no_replica_ends_above_its_bound() -> None:
    # A Zipf-like mix: a few keys (shared system prompts, say) carry most requests.
    rng = random.Random(11)
    hot = [key_hash(f"hot-{n}".encode()) for n in range(5)]
    members = [("m-1", 1.0), ("m-2", 1.0), ("m-3", 2.0), ("m-4", 1.0)]
    rendezvous = Rendezvous(members)
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
        pick = rendezvous.pick(hot_or_cold(), load_of=loads.__getitem__, load_factor=load_factor)
        assert pick.member is not None
        loads[pick.member] += 1
        total = sum(loads.values())
        for member, weight in weights.items():
            assert loads[member] <= bound(total, weight, 5.0, load_factor), (step, dict(loads))
    # As they also end, the replica that takes one is within its bound once it has it.
    for _ in range(3000):
        for _ in range(rng.randrange(3)):
            loads[rng.choice([m for m in loads if loads[m] > 0])] -= 1
        pick = rendezvous.pick(hot_or_cold(), load_of=loads.__getitem__, load_factor=load_factor)
        assert pick.member is not None
        loads[pick.member] += 1
        total = sum(loads.values())
        assert loads[pick.member] <= bound(total, weights[pick.member], 5.0, load_factor)
    # Without the bound the hottest key's home would carry most of it all.
    homes = Counter(rendezvous.home(k) for k in hot)
    assert max(homes.values()) >= 2


def test_the_bound_passes_a_full_home_over_for_the_next_on_the_walk() -> None:
    rendezvous = Rendezvous(replicas(4))
    key = KEYS[0]
    home, second = list(rendezvous.walk(key))[:2]
    loads = Counter(
        {home: 10, second: 0, **{m: 0 for m in rendezvous.members if m not in (home, second)}}
    )
    pick = rendezvous.pick(key, load_of=loads.__getitem__, load_factor=0.25)
    assert (pick.member, pick.reason, pick.passed_over) == (second, "over_bound", 1)
    loads.update({m: 2 - loads[m] for m in rendezvous.members})  # 2 each: total 8
    # Its share with this request: ceil(1.25 * 9 / 4) = 3; it carries 2, so it takes it.
    assert rendezvous.pick(key, load_of=loads.__getitem__, load_factor=0.25) == (home, "home", 0)
    loads[home] = 4  # total 10: ceil(1.25 * 11 / 4) = 4, and 4 + 1 is over it
    assert rendezvous.pick(key, load_of=loads.__getitem__, load_factor=0.25).member == second


def test_a_refused_replica_is_passed_over_and_all_refused_picks_none() -> None:
    rendezvous = Rendezvous(replicas(3))
    key = KEYS[1]
    home, second, _third = rendezvous.walk(key)
    idle: Counter[str] = Counter()
    pick = rendezvous.pick(
        key, load_of=idle.__getitem__, load_factor=0.25, refuse={home}.__contains__
    )
    assert (pick.member, pick.reason) == (second, "refused")
    nobody = rendezvous.pick(key, load_of=idle.__getitem__, load_factor=0.25, refuse=lambda m: True)
    assert (nobody.member, nobody.passed_over) == (None, 3)


def test_a_floor_under_the_bound_keeps_a_key_home_at_light_load() -> None:
    rendezvous = Rendezvous(replicas(4))
    key = KEYS[2]
    home = rendezvous.home(key)
    loads = Counter({home: 1})  # 1 in all: the formula's bound is ceil(1.25 * 2 / 4) = 1
    assert rendezvous.pick(key, load_of=loads.__getitem__, load_factor=0.25).reason == "over_bound"
    floored = rendezvous.pick(key, load_of=loads.__getitem__, load_factor=0.25, min_bound=4)
    assert (floored.member, floored.reason) == (home, "home")
    assert bound(1, 1.0, 4.0, 0.25, min_bound=4) == 4


def test_no_members_no_home() -> None:
    rendezvous = Rendezvous([])
    assert rendezvous.home(KEYS[0]) is None
    assert rendezvous.pick(KEYS[0], load_of=lambda m: 0, load_factor=0.25).member is None


def test_absent_members_are_passed_over_and_leave_the_bounds_to_the_others() -> None:
    rendezvous = Rendezvous(replicas(3))
    key = KEYS[3]
    home, second, gone = rendezvous.walk(key)
    loads = Counter({home: 5, second: 5, gone: 0})
    # The two left carry 10: ceil(1.25 * 11 / 2) = 7 each, as among the two alone.
    pick = rendezvous.pick(key, load_of=loads.__getitem__, load_factor=0.25, absent={gone})
    assert pick == (home, "home", 0)
    alone = Rendezvous([(home, 1.0), (second, 1.0)])
    assert alone.pick(key, load_of=loads.__getitem__, load_factor=0.25).member == home
    moved = rendezvous.pick(key, load_of=loads.__getitem__, load_factor=0.25, absent={home, gone})
    assert moved == (second, "refused", 1)
    nobody = rendezvous.pick(
        key, load_of=loads.__getitem__, load_factor=0.25, absent=set(rendezvous.members)
    )
    assert (nobody.member, nobody.passed_over) == (None, 3)


def test_a_keys_fraction_is_below_1_spread_evenly_and_unrelated_to_its_replica() -> None:
    fractions = [key_fraction(key) for key in KEYS]
    assert all(0.0 <= f < 1.0 for f in fractions)
    assert key_fraction(2**64 - 1) < 1.0
    assert 0.48 < sum(f < 0.5 for f in fractions) / len(KEYS) < 0.52
    # The keys of the hash space's first half draw below 0.5 as often as the others do,
    first_half = [f for key, f in zip(KEYS, fractions, strict=True) if key < 2**63]
    assert 0.47 < sum(f < 0.5 for f in first_half) / len(first_half) < 0.53
    # and so do the keys of one replica of two: a canary's side says nothing of the replica.
    pair = Rendezvous(replicas(2))
    homed = [f for key, f in zip(KEYS, fractions, strict=True) if pair.home(key) == "m-1"]
    assert 0.47 < sum(f < 0.5 for f in homed) / len(homed) < 0.53


# -- weights at any scale, and keys that stay put ---------------------------------------

MANY_KEYS = [key_hash(f"session-{n}".encode()) for n in range(100_000)]


def homes(members: list[tuple[str, float]], keys: list[int] = MANY_KEYS) -> list[str | None]:
    rendezvous = Rendezvous(members)
    return [rendezvous.home(k) for k in keys]


def test_shares_follow_the_weights_whatever_their_scale() -> None:
    for scale in (1e-3, 1.0, 1e6 / 6):
        members = [(f"m-{n}", n * scale) for n in (1, 2, 3)]
        shares = Counter(homes(members))
        for member, weight in members:
            expected = weight / (6 * scale)
            assert abs(shares[member] / len(MANY_KEYS) - expected) < 0.03 * expected, scale


def test_a_weight_a_million_times_another_takes_a_millionth_of_the_keys_from_it() -> None:
    # A member's share is its weight over the total, however far apart the weights are: no
    # member has a share of at least one point of a ring, whatever its weight.
    members = [("tiny", 1e-3), ("one", 1.0), ("big", 1e3), ("huge", 1e6)]
    shares = Counter(homes(members))
    assert 60 <= shares["big"] <= 140  # 100,000 * 1e3 / 1,001,001 = 99.9
    assert shares["one"] <= 3  # 0.1 expected
    assert shares["tiny"] == 0
    assert shares["huge"] == len(MANY_KEYS) - shares["big"] - shares["one"]


def test_scaling_every_weight_alike_moves_no_key() -> None:
    weights = {"m-1": 1.0, "m-2": 2.0, "m-3": 3.0, "m-4": 5.0}
    base = homes(list(weights.items()), KEYS)
    for scale in (1e-3, 1e6 / 5):
        assert homes([(m, w * scale) for m, w in weights.items()], KEYS) == base


def moves(before: list[tuple[str, float]], after: list[tuple[str, float]]) -> list[tuple[str, str]]:
    return [
        (one, other)
        for one, other in zip(homes(before), homes(after), strict=True)
        if one != other
        if one is not None and other is not None
    ]


def test_a_weight_2_replica_added_to_four_of_weight_1_takes_a_third_of_the_keys_only() -> None:
    four = replicas(4)
    moved = moves(four, [*four, ("m-5", 2.0)])
    assert {to for _, to in moved} == {"m-5"}  # no key moves between the four
    assert 0.32 <= len(moved) / len(MANY_KEYS) <= 0.347  # 2/6 expected


def test_a_replica_benched_from_1_to_2_only_takes_keys_from_the_others() -> None:
    five = replicas(5)
    moved = moves(five, [("m-1", 2.0), *five[1:]])
    assert {to for _, to in moved} == {"m-1"}
    assert 0.125 <= len(moved) / len(MANY_KEYS) <= 0.142  # 2/6 - 1/5 = 13.3 % expected


def test_the_heaviest_replica_made_lighter_only_hands_keys_to_the_others() -> None:
    # On a ring whose points follow the heaviest weight, this changed every replica's points.
    members = [("m-1", 4.0), ("m-2", 1.0), ("m-3", 2.0), ("m-4", 1.0)]
    moved = moves(members, [("m-1", 1.0), *members[1:]])
    assert {away for away, _ in moved} == {"m-1"}
    assert 0.29 <= len(moved) / len(MANY_KEYS) <= 0.31  # 4/8 - 1/5 = 30 % expected


def test_members_without_weight_are_home_to_no_key_and_last_on_every_walk() -> None:
    # Weights at or below zero count as zero, as in the bounds: such a member takes a request
    # only when those with weight cannot (its bound is the floor).
    members = [("m-1", 1.0), ("m-2", 2.0), ("idle", 0.0), ("broken", -3.0)]
    rendezvous = Rendezvous(members)
    assert rendezvous.weights["broken"] == 0.0
    for k in KEYS[:2000]:
        assert set(list(rendezvous.walk(k))[2:]) == {"idle", "broken"}
    busy = Counter({"m-1": 1, "m-2": 1})
    pick = rendezvous.pick(
        KEYS[0], load_of=busy.__getitem__, load_factor=0.25, refuse={"m-1", "m-2"}.__contains__
    )
    assert pick.member in {"idle", "broken"}
    # None with weight: the draws alone decide, an even share each.
    shares = Counter(homes([("a", 0.0), ("b", 0.0)], KEYS))
    assert 0.47 <= shares["a"] / len(KEYS) <= 0.53


def test_weights_the_spec_refuses_are_walked_as_its_nearest_and_never_break_a_pick() -> None:
    # A routing table written otherwise than by the spec: an infinite weight made the bound
    # NaN, and weights so small that their inverse is infinite made the draws' scores NaN;
    # either failed every keyed request of the model.
    tables = (
        [("m-1", math.inf), ("m-2", 1.0)],
        [("m-1", 5e-324), ("m-2", 5e-324)],
        [("m-1", 1e-300), ("m-2", 1.0), ("m-3", math.nan)],
    )
    for members in tables:
        rendezvous = Rendezvous(members)
        for k in KEYS[:200]:
            pick = rendezvous.pick(k, load_of=lambda member: 1.0, load_factor=0.25)
            assert pick.member is not None
    assert Rendezvous(tables[0]).weights == {"m-1": 1e6, "m-2": 1.0}  # MAX_WEIGHT
    assert Rendezvous(tables[2]).weights == {"m-1": 1e-3, "m-2": 1.0, "m-3": 0.0}  # MIN_WEIGHT


# -- the same walks in every process ---------------------------------------------------


def expected_walk(key: int, members: list[tuple[str, float]]) -> list[str]:
    """The walk by the formula, written out here from its parts' definitions: the
    splitmix64 finaliser of the key, made odd; each member's BLAKE2b-64 of its id, made odd;
    u = their product mod 2**64 over 2**64; members with weight by weight / -ln(u), highest
    first, then the others by u."""
    mask = 2**64 - 1
    k = key
    k = ((k ^ (k >> 30)) * 0xBF58476D1CE4E5B9) & mask
    k = ((k ^ (k >> 27)) * 0x94D049BB133111EB) & mask
    k = (k ^ (k >> 31)) | 1

    def score(member: tuple[str, float]) -> tuple[bool, float]:
        name, weight = member
        seed = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")
        u = (k * (seed | 1) & mask) / 2**64
        return (True, weight / -math.log(u)) if weight > 0 else (False, u)

    return [name for name, _ in sorted(members, key=score, reverse=True)]


def test_walks_follow_the_formula() -> None:
    # The published outputs of splitmix64 seeded with 0 pin the mixer itself.
    assert mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    assert mix64(2 * 0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4
    sets = [
        replicas(5),
        [("gpu-a-1", 1.0), ("gpu-b-7", 2.5), ("gpu-c-3", 0.001), ("gpu-d-9", 1e6)],
        [(f"r-{n}", 1.0 + n / 64) for n in range(64)],
        [("m-1", 1.0), ("m-2", 1.0), ("idle", 0.0), ("gone", 0.0)],
    ]
    for members in sets:
        rendezvous = Rendezvous(members)
        for k in KEYS[:300]:
            assert list(rendezvous.walk(k)) == expected_walk(k, members), (members, k)
            assert rendezvous.home(k) == expected_walk(k, members)[0]


def test_another_process_walks_every_key_the_same_way() -> None:
    members = [("m-1", 1.0), ("m-2", 2.0), ("m-3", 0.5), ("m-4", 1.0), ("m-5", 0.0)]
    program = (
        "import json, sys\n"
        "from app.domain.rendezvous import Rendezvous, key_hash\n"
        "members = [tuple(m) for m in json.loads(sys.argv[1])]\n"
        "rendezvous = Rendezvous(members)\n"
        "keys = [key_hash(f'conversation-{n}'.encode()) for n in range(500)]\n"
        "print(json.dumps([list(rendezvous.walk(k)) for k in keys]))\n"
    )
    for hash_seed in ("1", "2"):  # Python's own hash() differs between these processes
        done = subprocess.run(
            [sys.executable, "-c", program, json.dumps(members)],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        )
        rendezvous = Rendezvous(members)
        assert json.loads(done.stdout) == [list(rendezvous.walk(k)) for k in KEYS[:500]]


def test_a_remembered_walk_is_the_walk() -> None:
    # Walks past the home are remembered for the most recent keys (64 of them with 64
    # members): walking them again, or after they were forgotten, gives the same walks.
    members = [(f"r-{n}", 1.0 + n % 3) for n in range(64)]
    rendezvous = Rendezvous(members)
    keys = KEYS[:200]
    first = [list(rendezvous.walk(k)) for k in keys]
    again = [list(rendezvous.walk(k)) for k in reversed(keys)][::-1]
    assert first == again == [expected_walk(k, members) for k in keys]


def test_what_a_member_adds_to_the_total_may_be_capped_below_its_load() -> None:
    rendezvous = Rendezvous(replicas(3))
    key = KEYS[4]
    home, second, liar = rendezvous.walk(key)
    loads = Counter({home: 10, second: 0, liar: 1e9})
    refused = {liar}.__contains__
    # Counted whole, the liar's billion lifts the home's bound past anything it carries.
    trusting = rendezvous.pick(key, load_of=loads.__getitem__, load_factor=0.25, refuse=refused)
    assert trusting == (home, "home", 0)
    # Counted at 4 it lifts no bound: 14 in all, ceil(1.25 * 15 / 3) = 7, and the home's
    # 10 is over it, as with the liar idle.
    capped = rendezvous.pick(
        key,
        load_of=loads.__getitem__,
        load_factor=0.25,
        refuse=refused,
        counted_of=lambda m: min(loads[m], 4.0),
    )
    assert capped == (second, "over_bound", 1)
