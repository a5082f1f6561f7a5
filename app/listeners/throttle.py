"""A budget of failed authentications per client address.

Each address has a token bucket: ``burst`` failures at once, refilled at
``per_minute``. A failure spends a token; an address with none left is answered 429 with
``Retry-After`` until one is back. Only credentials that were presented and did not check
out count: a request without any is no guess.

Memory is bounded: at most ``max_addresses`` buckets are kept, the least recently touched
dropped first (``app.listeners.buckets``), so a flood of addresses costs the flooder its
own budget, not the server its memory. IPv6 addresses count by their /64, the block one
host is usually given, so that a host cannot draw a fresh budget from each of its
addresses.

How each listener uses it (see docs/security.md): the gateway answers 429 instead of 401
once an address is out of failures, and serves a valid key from it regardless, since a
key's 256-bit secret cannot be guessed and a load balancer's address is every client's;
the admin API refuses an address that is out of failures before it checks the token, since
an admin token may be short enough to guess.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.listeners.buckets import KeyedBuckets

DEFAULT_BURST = 20
DEFAULT_PER_MINUTE = 60.0
DEFAULT_MAX_ADDRESSES = 10_000


@dataclass(frozen=True)
class FailureLimits:
    burst: int = DEFAULT_BURST
    """Failures an address may make at once."""
    per_minute: float = DEFAULT_PER_MINUTE
    """Failures it earns back each minute."""
    max_addresses: int = DEFAULT_MAX_ADDRESSES

    def problems(self) -> list[str]:
        found = []
        if self.burst < 1:
            found.append(f"--auth-failure-burst must be at least 1, not {self.burst}")
        if not 0 < self.per_minute < math.inf:
            found.append(f"--auth-failures-per-minute must be positive, not {self.per_minute}")
        return found


class FailureBudget:
    def __init__(
        self, limits: FailureLimits | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or FailureLimits()
        self._clock = clock
        self._buckets = KeyedBuckets(
            burst=float(self.limits.burst),
            per_second=self.limits.per_minute / 60,
            max_keys=self.limits.max_addresses,
        )
        """By address group."""

    def wait_s(self, address: str | None) -> float:
        """Seconds until ``address`` may fail again; 0 while it has failures left."""
        return self._buckets.wait_s(address_group(address), self._clock())

    def spend(self, address: str | None) -> float:
        """Count a failure from ``address``: 0 if it had one left, else the seconds until it
        has one again (the failure was over budget)."""
        return self._buckets.spend(address_group(address), self._clock())


def address_group(address: str | None) -> str:
    """The key an address counts under: itself for IPv4, its /64 for IPv6 (the block one
    host is usually given), the IPv4 address an IPv4-mapped one holds. The agent hub's cap
    on handshakes counts by it too (``app.hub.gate``)."""
    if not address:
        return ""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)
