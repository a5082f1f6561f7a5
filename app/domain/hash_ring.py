"""Consistent hashing with bounded loads: which replica a routing key goes to.

A ring holds ``VNODES`` points per replica of the heaviest weight, and proportionally fewer
for lighter ones (at least one), each point the hash of ``"<replica id>#<n>"``. A key's
home is the owner of the first point at or after the key's hash, going round; the replicas
after it are the distinct owners met going on round the ring. The ring depends only on the
members and their weights, never on the order they are given in or on the process: two
gateways that read the same routing table build the same ring and send a key to the same
replica, with no state shared between them. Adding a replica takes over only the keys that
now land on its points, about ``1/N`` of them; removing one hands only its own keys on.

Bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018): a request goes to the first
replica on its key's walk whose load stays within ``(1 + load_factor)`` times its fair share
once it takes the request: ``load + 1 <= ceil((1 + load_factor) * (total + 1) * weight /
total_weight)``. The fair shares add up to at least ``total + 1``, so some replica always
has room under its bound; no replica ends above it, however skewed the keys are. A replica
the caller refuses (saturated, or excluded) is passed over the same way. A caller may set
a floor under every bound (``min_bound``): at loads of a request or two the formula's
bound is 1, and a replica serving one request would pass a key on to an idle one. Members
the caller excludes outright (``absent``) are passed over and take no part in the bounds:
the others share the load as if those had left the ring.

Pure: hashing is BLAKE2b from the standard library (the same in every process, unlike
``hash()``); no clock, no I/O.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal, NamedTuple

VNODES = 160
"""Points of a replica of the heaviest weight; 160 keeps a replica's share within a few
percent of its weight's (as in Ketama)."""

Reason = Literal["home", "over_bound", "refused"]
"""Why a pick landed where it did: ``home`` (the key's own replica took it), ``over_bound``
(the replicas before it on the walk were above their bound) or ``refused`` (the first
replica passed over was refused by the caller: saturated, or excluded)."""


def key_hash(data: bytes) -> int:
    """A 64-bit hash of ``data``, the same in every process."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def key_fraction(key: int) -> float:
    """A number in [0, 1) drawn from the 64-bit ``key``, the same in every process and
    unrelated to where the key lands on a ring (the top bits of the key times the golden
    ratio, Fibonacci hashing: every bit of the key moves them): a keyed request's side of a
    canary split. A key below a share stays below any larger one."""
    return (((key * _GOLDEN) & _MASK64) >> 11) / 9007199254740992.0  # 53 bits: below 1


class Pick(NamedTuple):
    member: str | None
    """The replica chosen; ``None`` when every member was refused."""
    reason: Reason
    passed_over: int
    """Replicas passed over before it."""


class HashRing:
    """The ring of ``members`` (replica id, weight); immutable once built."""

    __slots__ = ("_owners", "_points", "members", "weights")

    def __init__(self, members: Sequence[tuple[str, float]], *, vnodes: int = VNODES) -> None:
        self.members: tuple[str, ...] = tuple(sorted({m for m, _ in members}))
        self.weights: dict[str, float] = {m: max(w, 0.0) for m, w in members}
        heaviest = max(self.weights.values(), default=0.0)
        points: list[tuple[int, str]] = []
        for member in self.members:
            weight = self.weights[member]
            count = max(1, round(vnodes * weight / heaviest)) if heaviest > 0 else 1
            points.extend((key_hash(f"{member}#{n}".encode()), member) for n in range(count))
        points.sort()
        self._points = [p for p, _ in points]
        self._owners = [m for _, m in points]

    def __len__(self) -> int:
        return len(self.members)

    def walk(self, key: int) -> Iterator[str]:
        """The members in the key's order: its home first, then each next distinct owner."""
        count = len(self._points)
        if count == 0:
            return
        start = bisect.bisect_left(self._points, key)
        seen: set[str] = set()
        wanted = len(self.members)
        for step in range(count):
            owner = self._owners[(start + step) % count]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == wanted:
                    return

    def home(self, key: int) -> str | None:
        return next(self.walk(key), None)

    def pick(
        self,
        key: int,
        *,
        load_of: Callable[[str], float],
        load_factor: float,
        refuse: Callable[[str], bool] = lambda member: False,
        absent: AbstractSet[str] = frozenset(),
        min_bound: int = 1,
    ) -> Pick:
        """The first member on the key's walk the caller does not ``refuse`` and whose load
        (``load_of``: requests it carries) stays within its bound with this request; no
        member's bound is below ``min_bound``. Members in ``absent`` (excluded: ejected, or
        left out by a retry) are refused, and the bounds are shared among the others, as
        if they had left the ring: counted in, their weight would shrink the others'
        shares below what those carry together, and no member could take the request."""
        present: Iterable[str] = self.members
        weights: Iterable[float] = self.weights.values()
        if absent:
            present = [m for m in self.members if m not in absent]
            weights = [self.weights[m] for m in present]
        total = 0.0
        for member in present:
            total += load_of(member)
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
