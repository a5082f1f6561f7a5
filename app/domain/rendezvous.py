"""Weighted rendezvous hashing with bounded loads: which replica a routing key goes to.

Every member (replica id, weight) draws a number ``u`` in (0, 1) for each key, from the key
and from a seed of its own; its score for the key is ``weight / -ln(u)``. The key's walk is
the members in descending score, its home the first. ``-ln(u)`` is exponentially
distributed, so ``-ln(u) / weight`` is too, at rate ``weight``, and the least of such
independent draws is a given member's with probability its weight over the total weight:
each member is home to its weight's share of the keys, whatever the weights' scale (1e-3
beside 1e6 as well as 1 beside 2). Members of zero (or negative, or NaN) weight come after
all the others, in the order of their draws: home to no key while another member has
weight. A weight beyond the spec's bounds (only a routing table written otherwise has one)
is walked as the nearest bound (``usable_weight``).

A member's score for a key depends on the key, its id and its weight, and on nothing else:

* the walk does not depend on the order the members are given in, nor on the process: two
  gateways that read the same routing table send a key to the same replica, with no state
  shared between them;
* a member added takes over only the keys on which it now scores highest (its weight's
  share of them), each from whichever member had it; one removed hands on only its own
  keys, each to the next on that key's walk;
* a member whose weight changes gains keys from the others or hands some of its own to
  them, and no key moves between two members that did not change.

The draw: the key is mixed by the splitmix64 finaliser (every bit of the key moves every
bit of the mix) and made odd, ``k``; each member's seed is the BLAKE2b hash of its id, made
odd, fixed when the members are set; its draw is ``(k * seed) mod 2**64`` and ``u`` that
over ``2**64`` (multiply-shift hashing, Dietzfelbinger et al., 1997: for one key, the
members' draws are as independent as their seeds are). Integer arithmetic, the same on
every machine; the scores are IEEE doubles and the standard library's ``log``, so only a
machine whose ``log`` rounds differently could order two members whose scores agree to
the last bit differently.

Cost: one multiplication of ``k`` by all the seeds at once, laid side by side in one
integer 128 bits apart (no product reaches into the next), makes every member's draw: a
key costs a few calls into C however many members there are. When the members all have
one weight, the home is the highest draw; else only the members whose draws are high
enough to beat the highest draw's score are scored, usually one or two. The members past
the home are sorted only when the home cannot take the request, and the walks of the
keys that went past their home most recently are remembered: a hot key's home is full,
and every request with that key is walked past it.

Bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018): a request goes to the first
member on its key's walk whose load stays within ``(1 + load_factor)`` times its fair share
once it takes the request: ``load + 1 <= ceil((1 + load_factor) * (total + 1) * weight /
total_weight)``. The fair shares add up to at least ``total + 1``, so some member always
has room under its bound; no member ends above it, however skewed the keys are. A member
the caller refuses (saturated, or excluded) is passed over the same way. A caller may set
a floor under every bound (``min_bound``): at loads of a request or two the formula's
bound is 1, and a replica serving one request would pass a key on to an idle one. Members
the caller excludes outright (``absent``) are passed over and take no part in the bounds:
the others share the load as if those had left. What each member adds to the total may be
less than its load (``counted_of``): a member whose count is a lie (an engine saying it
holds a billion requests) would otherwise raise every other's bound with it, and keys would
stay on full homes.

This replaced a consistent-hash ring whose points per member followed its weight relative
to the heaviest member's: a change of the heaviest weight moved keys between members that
had not changed. The two send a key to different replicas: the upgrade to this one moves
most keys once (all but about ``1/N`` of them, ``N`` replicas).

Pure: no clock, no I/O, and never Python's per-process ``hash()``; the walks remembered are
a cache, the same walks as computed afresh.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from itertools import repeat
from operator import mul, sub
from typing import Literal, NamedTuple

from app.domain.model_spec import MAX_WEIGHT, MIN_WEIGHT

Reason = Literal["home", "over_bound", "refused"]
"""Why a pick landed where it did: ``home`` (the key's own replica took it), ``over_bound``
(the replicas before it on the walk were above their bound) or ``refused`` (the first
replica passed over was refused by the caller: saturated, or excluded)."""

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_LANE_BITS = 128
"""Room for one member's product of two 64-bit numbers in the seeds laid side by side."""
_LN_2_64 = 64 * math.log(2)
"""``ln(2**64)``: ``ln(u)`` is ``ln(draw) - _LN_2_64``."""
_WALKED_LANES_KEPT = 4096
"""How many members the remembered walks hold in all: a hot key's home is full, and every
request with that key is walked past it, so its walk is remembered rather than sorted for
each; with 64 members, the last 64 such keys'."""
_FLOOR_SCALE = 2.0**64 * (1 - 1e-9)
"""``2**64``, less a margin far wider than the rounding of the floor's sums."""


def usable_weight(weight: float) -> float:
    """The weight a member is walked with: 0 for none (at or below 0, or NaN), else within
    the bounds a spec accepts (``MIN_WEIGHT`` to ``MAX_WEIGHT``), which the weights of a
    valid routing table are already. Beyond them, an infinite weight made the bounds NaN,
    and one whose inverse is infinite made the scores NaN: every pick raised."""
    if not weight > 0.0:
        return 0.0
    return MIN_WEIGHT if weight < MIN_WEIGHT else float(min(weight, MAX_WEIGHT))


def key_hash(data: bytes) -> int:
    """A 64-bit hash of ``data``, the same in every process."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def key_fraction(key: int) -> float:
    """A number in [0, 1) drawn from the 64-bit ``key``, the same in every process and
    unrelated to the replica the key goes to (the top bits of the key times the golden
    ratio, Fibonacci hashing: every bit of the key moves them; the draws use the key's
    splitmix64 mix instead): a keyed request's side of a canary split. A key below a share
    stays below any larger one."""
    return (((key * _GOLDEN) & _MASK64) >> 11) / 9007199254740992.0  # 53 bits: below 1


def mix64(value: int) -> int:
    """The splitmix64 finaliser (Steele, Lea and Flood, 2014) of the low 64 bits of
    ``value``: a one-to-one map of 64-bit numbers in which every input bit moves every
    output bit."""
    mixed = value & _MASK64
    mixed = ((mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) & _MASK64
    return mixed ^ (mixed >> 31)


def member_seed(member: str) -> int:
    """The odd 64-bit number a member's draws are made with."""
    return key_hash(member.encode()) | 1


class Pick(NamedTuple):
    member: str | None
    """The replica chosen; ``None`` when every member was refused."""
    reason: Reason
    passed_over: int
    """Replicas passed over before it."""


class Rendezvous:
    """The walks of ``members`` (replica id, weight); immutable once built."""

    __slots__ = (
        "_draws_of",
        "_heaviest",
        "_inverse_weights",
        "_lanes",
        "_one_weight",
        "_seeds",
        "_walks",
        "_walks_kept",
        "_weighted",
        "members",
        "weights",
    )

    def __init__(self, members: Sequence[tuple[str, float]]) -> None:
        self.members: tuple[str, ...] = tuple(sorted({m for m, _ in members}))
        self.weights: dict[str, float] = {m: usable_weight(w) for m, w in members}
        # Lanes: the members with weight, heaviest first, then those without.
        weighted = sorted((m for m in self.members if self.weights[m] > 0.0), key=self._heavier)
        self._lanes = (*weighted, *(m for m in self.members if self.weights[m] == 0.0))
        self._weighted = len(weighted)
        self._inverse_weights = [1.0 / self.weights[m] for m in weighted]
        self._heaviest = self.weights[weighted[0]] if weighted else 0.0
        self._one_weight = not weighted or self.weights[weighted[-1]] == self._heaviest
        """Every member with weight has the same: the order of draws is the order of scores."""
        self._seeds = sum(
            member_seed(m) << (_LANE_BITS * lane) for lane, m in enumerate(self._lanes)
        )
        """Every lane's seed in one integer, ``_LANE_BITS`` apart."""
        self._draws_of = struct.Struct("<" + "Q8x" * len(self._lanes)).unpack
        """The low 64 bits of every lane, from the little-endian bytes of a product."""
        self._walks: dict[int, tuple[str, ...]] = {}
        """Whole walks of the keys walked past their home most recently, oldest first."""
        self._walks_kept = max(1, _WALKED_LANES_KEPT // max(1, len(self._lanes)))

    def _heavier(self, member: str) -> tuple[float, str]:
        return -self.weights[member], member

    def __len__(self) -> int:
        return len(self.members)

    def _draws(self, key: int) -> tuple[int, ...]:
        """Every lane's draw for ``key``: ``(k * seed) mod 2**64``, which is ``u * 2**64``."""
        product = (mix64(key) | 1) * self._seeds
        return self._draws_of(product.to_bytes(len(self._lanes) * _LANE_BITS // 8, "little"))

    def _home(self, draws: tuple[int, ...]) -> int:
        """The lane of the highest score among those with weight (of equal ones, the first):
        the highest draw when they all have one weight. Else only lanes whose draw is high
        enough to beat the highest draw's score are scored: ``ln(u) / weight >= best`` needs
        ``u >= exp(best * weight) >= exp(best * heaviest)`` (``best`` is below 0), which
        few draws are."""
        weighted = self._weighted
        if weighted < len(draws):
            if not weighted:  # none has weight: the highest draw
                return draws.index(max(draws))
            draws = draws[:weighted]
        highest = max(draws)
        lane = draws.index(highest)
        if self._one_weight:
            return lane
        inverse_weights = self._inverse_weights
        best = (math.log(highest) - _LN_2_64) * inverse_weights[lane]
        floor = int(math.exp(best * self._heaviest) * _FLOOR_SCALE)  # ints compare faster
        for draw in filter(floor.__le__, draws):
            other = draws.index(draw)
            rank = (math.log(draw) - _LN_2_64) * inverse_weights[other]
            if rank > best or (rank == best and other < lane):
                best, lane = rank, other
        return lane

    def _order(self, draws: tuple[int, ...]) -> list[int]:
        """Every lane with weight in descending score (of equal ones, the first first; when
        they all have one weight, in descending draw), then the others in descending draw."""
        weighted = self._weighted
        if self._one_weight:
            order = sorted(range(weighted), key=draws.__getitem__, reverse=True)
        else:  # ln(u) / weight, the same sums as _home's; the sort is stable
            ranks = list(
                map(mul, map(sub, map(math.log, draws), repeat(_LN_2_64)), self._inverse_weights)
            )
            order = sorted(range(weighted), key=ranks.__getitem__, reverse=True)
        if weighted < len(draws):
            order += sorted(range(weighted, len(draws)), key=draws.__getitem__, reverse=True)
        return order

    def _walk(self, key: int, draws: tuple[int, ...]) -> Iterator[str]:
        """The lanes' members, home first; the others are ordered, and the walk remembered,
        only when asked for."""
        lanes = self._lanes
        home = self._home(draws)
        yield lanes[home]
        walk = (lanes[home], *(lanes[lane] for lane in self._order(draws) if lane != home))
        walks = self._walks
        if len(walks) >= self._walks_kept:
            del walks[next(iter(walks))]  # the least recently walked
        walks[key] = walk
        yield from walk[1:]

    def walk(self, key: int) -> Iterator[str]:
        """The members in the key's order: its home first, then in descending score."""
        if not self._lanes:
            return iter(())
        walks = self._walks
        walk = walks.pop(key, None)
        if walk is None:
            return self._walk(key, self._draws(key))
        walks[key] = walk  # the most recently walked now
        return iter(walk)

    def home(self, key: int) -> str | None:
        if not self._lanes:
            return None
        return self._lanes[self._home(self._draws(key))]

    def pick(
        self,
        key: int,
        *,
        load_of: Callable[[str], float],
        load_factor: float,
        refuse: Callable[[str], bool] = lambda member: False,
        absent: AbstractSet[str] = frozenset(),
        min_bound: int = 1,
        counted_of: Callable[[str], float] | None = None,
    ) -> Pick:
        """The first member on the key's walk the caller does not ``refuse`` and whose load
        (``load_of``: requests it carries) stays within its bound with this request; no
        member's bound is below ``min_bound``. Members in ``absent`` (excluded: ejected, or
        left out by a retry) are refused, and the bounds are shared among the others, as
        if they had left: counted in, their weight would shrink the others' shares below
        what those carry together, and no member could take the request. ``counted_of``:
        what a member adds to the total the bounds are shared from (``load_of`` when not
        given); a caller that cannot trust a member's own count caps it there, so that one
        member claiming a huge load cannot raise every other member's bound."""
        present: Iterable[str] = self.members
        weights: Iterable[float] = self.weights.values()
        if absent:
            present = [m for m in self.members if m not in absent]
            weights = [self.weights[m] for m in present]
        total = sum(map(counted_of or load_of, present), 0.0)
        total_weight = sum(weights) or 1.0
        share = (1.0 + load_factor) * (total + 1.0) / total_weight
        first_reason: Reason | None = None
        passed = 0
        for member in self.walk(key):
            if member in absent or refuse(member):
                first_reason = first_reason or "refused"
            elif load_of(member) + 1.0 > max(math.ceil(share * self.weights[member]), min_bound):
                first_reason = first_reason or "over_bound"
            else:
                return Pick(member, first_reason or "home", passed)
            passed += 1
        return Pick(None, first_reason or "refused", passed)


def bound(
    total: float, weight: float, total_weight: float, load_factor: float, min_bound: int = 1
) -> int:
    """The most requests a member of ``weight`` may carry while ``total`` are carried in all
    (``pick`` lets one more in while the member stays within this)."""
    return max(math.ceil((1.0 + load_factor) * total * weight / total_weight), min_bound)
