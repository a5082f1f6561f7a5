"""Passive health: replicas that keep failing are taken out of this gateway's rotation.

Every attempt at a replica tells something by the first byte of its answer's body (the
end of an answer read whole), or a stream by its end: an answer that got there is a
success (the engine is up, whatever the client asked); no answer at all (connection
refused or reset, timed out), a 5xx head, or a body that broke off or stalled before then
is a failure. An engine sends a stream's head before it has generated anything, so the
head alone is no verdict: a wedged engine answers every stream's head and then nothing,
and one that wedges mid-stream (a hung GPU) stalls every stream it holds. A client's
cancel says nothing.

A replica with ``consecutive_failures`` failures in a row (a success resets the count) is
ejected: routed around for a cool-off of ``base_cool_off_s``, doubled with each ejection
in a row, at most ``max_cool_off_s``. When its cool-off is over it is on probation: one
request at a time is let through to it, the probe. The probe's success returns the replica
to rotation; its failure ejects it again, for the next, longer cool-off. A probe that ends
without a verdict (its client left) lets the next request be the probe. The ejections in a
row are forgotten once a replica has stayed in rotation for ``max_cool_off_s``.

Probing with a real request, rather than a health check of our own, tests the path clients
use (an engine that answers ``/health`` but fails completions stays out), and costs a
client nothing: an attempt that fails before its first byte is retried on another replica
(``app.gateway.proxy``).

The cap (Envoy's ``max_ejection_percent``): of a model's ``n`` routed replicas, at most
``max_ejected_percent`` % (rounded down, but one whenever ``n >= 2``) are out at once,
and never all of them: a model with one replica is never ejected. Ejecting the last one
would turn failing requests into refused ones without sparing anyone, and keep a replica
that recovers out of rotation for its cool-off. A replica over the cap stays in rotation
(logged once per run of failures) and is ejected at its next failure once there is room.
And if the routing table leaves a model with ejected replicas only (the others were taken
out), they are all routed to again, as if none were ejected, rather than refusing the
model's requests.

Ejections are per gateway and per replica; a replica that leaves the routing table is
forgotten. The clock is a parameter, so the timing is tested without sleeping.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import structlog

from app.gateway.engine_bounds import MAX_TIMEOUT_S
from app.gateway.table import models_changed

log = structlog.get_logger("llmgw.gateway")

DEFAULT_CONSECUTIVE_FAILURES = 3
DEFAULT_BASE_COOL_OFF_S = 5.0
DEFAULT_MAX_COOL_OFF_S = 60.0
"""An idle GPU replica is costly: one that has recovered waits at most this long for its probe."""
DEFAULT_MAX_EJECTED_PERCENT = 50


@dataclass(frozen=True)
class EjectionPolicy:
    consecutive_failures: int = DEFAULT_CONSECUTIVE_FAILURES
    """Failures in a row that eject a replica; 0 turns ejection off."""
    base_cool_off_s: float = DEFAULT_BASE_COOL_OFF_S
    max_cool_off_s: float = DEFAULT_MAX_COOL_OFF_S
    max_ejected_percent: int = DEFAULT_MAX_EJECTED_PERCENT

    def problems(self) -> list[str]:
        """What is wrong with this policy, as messages naming the gateway's flags."""
        found = []
        if self.consecutive_failures < 0:
            found.append(
                f"--eject-after-failures must not be negative, not {self.consecutive_failures}"
            )
        if not self.base_cool_off_s > 0:
            found.append(f"--ejection-cool-off must be positive, not {self.base_cool_off_s}")
        for flag, seconds in (
            ("--ejection-cool-off", self.base_cool_off_s),
            ("--max-ejection-cool-off", self.max_cool_off_s),
        ):
            if seconds > MAX_TIMEOUT_S:
                # As the gateway's other durations: a replica ejected for 1e308 s never
                # comes back, and a day is longer than any cool-off means to be.
                found.append(f"{flag} must be at most {MAX_TIMEOUT_S:g} seconds, not {seconds:g}")
        if not self.max_cool_off_s >= self.base_cool_off_s:
            found.append(
                f"--max-ejection-cool-off ({self.max_cool_off_s}) must be at least "
                f"--ejection-cool-off ({self.base_cool_off_s})"
            )
        if not 0 <= self.max_ejected_percent <= 100:
            found.append(
                f"--max-ejected-percent must be between 0 and 100, not {self.max_ejected_percent}"
            )
        return found

    def cool_off_s(self, ejections: int) -> float:
        """The cool-off of the ``ejections``-th ejection in a row (1 for the first)."""
        doublings = min(max(ejections - 1, 0), 64)
        return float(min(self.base_cool_off_s * 2**doublings, self.max_cool_off_s))

    def max_ejected(self, replicas: int) -> int:
        """How many of a model's ``replicas`` may be out of rotation at once."""
        if replicas < 2 or self.max_ejected_percent == 0:
            return 0
        return min(replicas - 1, max(1, math.floor(replicas * self.max_ejected_percent / 100)))


class Ticket:
    """What the ejector knows of one lease: the replica's ejection run it was granted in,
    whether it is the probe, and whether its verdict is in."""

    __slots__ = ("episode", "probe", "settled")

    def __init__(self, episode: int, probe: bool) -> None:
        self.episode = episode
        self.probe = probe
        self.settled = False


class _Health:
    __slots__ = (
        "capped",
        "ejected_at",
        "ejections",
        "episode",
        "failures",
        "model",
        "probe_out",
        "returned_at",
        "until",
    )

    def __init__(self, model: str) -> None:
        self.model = model
        self.failures = 0
        """Failures in a row while in rotation."""
        self.ejections = 0
        """Ejections in a row: the cool-off's exponent."""
        self.until: float | None = None
        """Out of rotation until then, and on probation after; None: in rotation."""
        self.ejected_at = 0.0
        self.returned_at = 0.0
        self.probe_out = False
        self.episode = 0
        """Bumped at each ejection: verdicts of leases granted before it are ignored."""
        self.capped = False


@dataclass(frozen=True)
class EjectedReplica:
    """A replica out of this gateway's rotation, for ``/metrics`` and the report."""

    replica_id: str
    model: str
    ejections: int
    """Ejections in a row, this one included."""
    probation: bool
    """Its cool-off is over: waiting for a probe to succeed."""


class Ejector:
    def __init__(
        self, policy: EjectionPolicy | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy or EjectionPolicy()
        self._clock = clock
        self._health: dict[str, _Health] = {}
        self._by_model: dict[str, tuple[str, ...]] = {}
        self._out: set[str] = set()
        """Replicas out of rotation: cooling off or on probation."""
        self._total: Counter[tuple[str, str]] = Counter()
        """Ejections so far by (replica, model), for ``/metrics``."""

    # -- the routing table -----------------------------------------------------------------

    def track(self, replicas_by_model: Mapping[str, Iterable[str]]) -> None:
        """Follow the routed replicas of each model; others are forgotten. A model given
        the same tuple of replicas as the last time is passed over: what is known of them
        stands as it is."""
        before = self._by_model
        by_model = {
            model: ids if type(ids) is tuple else tuple(ids)
            for model, ids in replicas_by_model.items()
        }
        changed = models_changed(before, by_model)
        routed = {rid: model for model in changed for rid in by_model.get(model, ())}
        gone = [rid for model in changed for rid in before.get(model, ()) if rid not in routed]
        self._by_model = by_model
        for replica_id in gone:
            self._health.pop(replica_id, None)
            self._out.discard(replica_id)
        if gone:
            forgotten = set(gone)
            for key in [key for key in self._total if key[0] in forgotten]:
                del self._total[key]
        for replica_id, model in routed.items():
            health = self._health.get(replica_id)
            if health is None:
                self._health[replica_id] = _Health(model)
            else:
                health.model = model

    # -- routing ---------------------------------------------------------------------------

    def shunned(self, model: str, exclude: frozenset[str] = frozenset()) -> frozenset[str]:
        """The replicas of ``model`` not to route to now: those cooling off, and those on
        probation whose probe is out. Empty when that would be all of them but those in
        ``exclude`` (the replicas a request already failed on)."""
        if not self._out:
            return frozenset()
        candidates = [rid for rid in self._by_model.get(model, ()) if rid not in exclude]
        now = self._clock()
        shunned = frozenset(rid for rid in candidates if self._shuns(rid, now))
        return frozenset() if len(shunned) == len(candidates) else shunned

    def _shuns(self, replica_id: str, now: float) -> bool:
        if replica_id not in self._out:
            return False
        health = self._health[replica_id]
        assert health.until is not None
        return now < health.until or health.probe_out

    def granted(self, replica_id: str) -> Ticket:
        """A lease on ``replica_id`` was granted: the first on a replica on probation is
        its probe."""
        health = self._health.get(replica_id)
        if health is None:
            return Ticket(-1, probe=False)
        probe = (
            replica_id in self._out
            and not health.probe_out
            and health.until is not None
            and self._clock() >= health.until
        )
        if probe:
            health.probe_out = True
        return Ticket(health.episode, probe)

    # -- verdicts --------------------------------------------------------------------------

    def succeeded(self, replica_id: str, ticket: Ticket) -> None:
        health = self._current(replica_id, ticket)
        if health is None:
            return
        if ticket.probe:
            self._return(replica_id, health)
        elif replica_id not in self._out:
            health.failures = 0
            health.capped = False

    def failed(self, replica_id: str, ticket: Ticket, reason: str) -> None:
        health = self._current(replica_id, ticket)
        if health is None:
            return
        if ticket.probe:
            health.probe_out = False
            health.failures = 1
            self._eject(replica_id, health, reason)
            return
        if replica_id in self._out:
            return  # out already: this one was let through while every replica was out
        health.failures += 1
        threshold = self.policy.consecutive_failures
        if threshold == 0 or health.failures < threshold:
            return
        if self._capped(replica_id, health, reason):
            return
        self._eject(replica_id, health, reason)

    def abandoned(self, replica_id: str, ticket: Ticket) -> None:
        """The lease ended without a verdict (its client left): if it was the probe, the
        next request may be."""
        if ticket.settled:
            return
        ticket.settled = True
        health = self._health.get(replica_id)
        if ticket.probe and health is not None and health.episode == ticket.episode:
            health.probe_out = False

    def _current(self, replica_id: str, ticket: Ticket) -> _Health | None:
        """The replica's health if the verdict counts: the first of its lease, on a replica
        still routed, from the current run (a lease granted before an ejection says
        nothing more about it)."""
        if ticket.settled:
            return None
        ticket.settled = True
        health = self._health.get(replica_id)
        if health is None or health.episode != ticket.episode:
            return None
        return health

    def _capped(self, replica_id: str, health: _Health, reason: str) -> bool:
        replicas = self._by_model.get(health.model, ())
        out = sum(rid in self._out for rid in replicas)
        allowed = self.policy.max_ejected(len(replicas))
        if out < allowed:
            return False
        if not health.capped:
            health.capped = True
            log.warning(
                "replica_ejection_capped",
                replica_id=replica_id,
                model=health.model,
                failures=health.failures,
                reason=reason,
                ejected=out,
                replicas=len(replicas),
                max_ejected=allowed,
            )
        return True

    def _eject(self, replica_id: str, health: _Health, reason: str) -> None:
        now = self._clock()
        if replica_id not in self._out and now - health.returned_at >= self.policy.max_cool_off_s:
            health.ejections = 0  # it stayed in rotation long enough: start over
        health.ejections += 1
        cool_off_s = self.policy.cool_off_s(health.ejections)
        if replica_id not in self._out:
            health.ejected_at = now
        health.until = now + cool_off_s
        health.episode += 1
        health.capped = False
        self._out.add(replica_id)
        self._total[replica_id, health.model] += 1
        log.warning(
            "replica_ejected",
            replica_id=replica_id,
            model=health.model,
            failures=health.failures,
            reason=reason,
            ejections=health.ejections,
            cool_off_s=cool_off_s,
        )
        health.failures = 0

    def _return(self, replica_id: str, health: _Health) -> None:
        now = self._clock()
        log.info(
            "replica_returned",
            replica_id=replica_id,
            model=health.model,
            ejections=health.ejections,
            out_s=round(now - health.ejected_at, 3),
        )
        self._out.discard(replica_id)
        health.until = None
        health.probe_out = False
        health.failures = 0
        health.returned_at = now

    # -- what the gateway publishes --------------------------------------------------------

    def ejected(self) -> list[EjectedReplica]:
        """The replicas out of rotation now."""
        now = self._clock()
        found = []
        for replica_id in sorted(self._out):
            health = self._health[replica_id]
            assert health.until is not None
            found.append(
                EjectedReplica(replica_id, health.model, health.ejections, now >= health.until)
            )
        return found

    def ejections_total(self) -> dict[tuple[str, str], int]:
        """Ejections so far of each routed replica, by (replica, model)."""
        return dict(self._total)

    def routed(self) -> dict[str, str]:
        """Each tracked replica's model."""
        return {rid: health.model for rid, health in self._health.items()}
