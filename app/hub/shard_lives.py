"""What one connection may say about a shard's phase: a pure check of a node's word.

An honest agent reports each engine's life forward, on every connection alike:
``starting -> ready -> failed | stopped`` (``failed -> stopped`` too), never back, and
never the same phase twice (``agent.engines.changes.can_transition`` guards every change
it reports). Only a new launch begins again, with ``starting`` (or ``failed``, when the
engine could not be spawned), and an agent launches an engine only for a ``start_shard``.

So, per connection and per shard, a status is checked against the phase the connection
last said for that shard, in its hello or in an earlier status:

- a step forward (``FORWARD``) is taken;
- the same phase again is taken as it is (the agent answers a stop of a shard it has
  stopped with ``stopped`` again): it changes nothing, in the log either;
- any other status (a step back, or the first word about a shard the hello did not list:
  that engine was launched after the hello) is a new launch, and is
  taken only while the shard has launches left: one per ``start_shard`` for it sent on
  this connection, and one more, for the start that may have reached the agent before
  this connection did (on an earlier connection, or from an earlier leader), its engine
  spawning after the hello.

Anything else is refused (``ShardLives.refusal`` says why): a node flipping a shard
between two phases would otherwise write an event per message. The one free launch is
enough for an honest agent: the commands that start a shard share one id
(``app.domain.commands.start_command``), which the agent executes once, so at most one
start of it can still be in the agent's hands from before the connection. Statuses the
agent leaves out (those between its hello and the welcome) only make it skip steps: a step
forward over skipped ones is a step forward too, and a launch whose first statuses were
left out is still one launch, explained by its start.

The memory is bounded by what an honest agent can speak of, and so is everything a status
reaches (the live view holds the shards the connection spoke of, no others): the shards its
hello listed (at most ``MAX_SHARDS_PER_NODE``, ``app.hub.claims``), those a ``start_shard``
sent on it named, and at most ``MAX_SHARDS_STARTED_BEFORE`` others, first heard of in a
status. Those others are shards whose start (or stop) reached the agent before the
connection, their engines launched (or stopped) after the hello: commands for shards placed
on the node, each holding at least one of its at most 64 GPUs, so a few dozen at the most.
The status that would name one more is refused, whatever it says: before, every made-up
shard id spent a free launch of its own, and a node naming new ones grew the live view by
one shard a status, without end.

The shards started on the connection are bounded too: a shard whose launch ended
(``stopped``, ``failed``) is remembered among the last ``MAX_ENDED_KEPT`` ended ones, and
forgotten (its unspent launches with it) once more have ended since, so that a connection
that lasts months does not hold every engine it ever started. A shard forgotten so and
spoken of again is one first heard of in a status: it spends one of the
``MAX_SHARDS_STARTED_BEFORE``, so no shard gets a free launch twice beyond that bound (an
honest agent speaks of an ended shard again only after a ``start_shard`` for it, which
gives it its launch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.hub.claims import MAX_SHARDS_PER_NODE
from wire.messages import ShardReport, ShardState, ShardStatus

FORWARD: dict[ShardState, frozenset[ShardState]] = {
    "starting": frozenset({"ready", "failed", "stopped"}),
    "ready": frozenset({"failed", "stopped"}),
    "failed": frozenset({"stopped"}),
    "stopped": frozenset(),
}
"""The steps one engine's life takes; the agent's ``can_transition`` allows these alone."""
LAUNCHES_BEFORE_THE_CONNECTION = 1
"""New launches of a shard taken without a ``start_shard`` on this connection."""
MAX_SHARDS_STARTED_BEFORE = MAX_SHARDS_PER_NODE
MAX_ENDED_KEPT = MAX_SHARDS_PER_NODE
"""Ended shards remembered per connection; older ones are forgotten."""
ENDED: frozenset[ShardState] = frozenset({"failed", "stopped"})
"""Shards a connection may speak of that neither its hello listed nor a ``start_shard`` sent
on it named: those whose start reached the agent before the connection did."""


@dataclass
class _Life:
    phase: ShardState | None
    """What this connection last said about the shard; None before it said anything."""
    launches: int
    """New launches still to be taken."""


class ShardLives:
    """The shard phases one connection has reported, and the launches it may still report."""

    def __init__(self) -> None:
        self._lives: dict[tuple[str, int], _Life] = {}
        self._started_before = 0
        """Shards first heard of in a status: neither listed nor started on the connection."""
        self._ended: dict[tuple[str, int], None] = {}
        """The shards whose launch ended, oldest first."""

    def __len__(self) -> int:
        return len(self._lives)

    def listed(self, shards: Iterable[ShardReport]) -> None:
        """The hello's shards, in the phases it lists them."""
        for shard in shards:
            self._life(shard.replica_id, shard.shard_index).phase = shard.state

    def start_sent(self, replica_id: str, shard_index: int) -> None:
        """A ``start_shard`` for the shard went out on this connection: one launch more."""
        self._life(replica_id, shard_index).launches += 1
        self._ended.pop((replica_id, shard_index), None)

    def refusal(self, status: ShardStatus) -> str | None:
        """Why ``status`` is not what an honest agent sends now, or None, and then it is
        taken as the shard's phase on this connection."""
        key = (status.replica_id, status.shard_index)
        life = self._lives.get(key)
        if life is None:
            if self._started_before == MAX_SHARDS_STARTED_BEFORE:
                return (
                    f"more than {MAX_SHARDS_STARTED_BEFORE} shards neither in the hello nor "
                    f"started on this connection: {status.replica_id}/{status.shard_index}"
                )
            self._started_before += 1
            life = self._life(*key)
        said, now = life.phase, status.state
        if now == said:
            return None  # said again (a stop of a shard already stopped): nothing changes
        if said is None or now not in FORWARD[said]:
            if life.launches == 0:
                return (
                    f"{said or 'nothing'} -> {now} for shard "
                    f"{status.replica_id}/{status.shard_index}: no start_shard explains it"
                )
            life.launches -= 1
        life.phase = now
        self._note_ended(key, life)
        return None

    def _note_ended(self, key: tuple[str, int], life: _Life) -> None:
        """Remember ``key`` among the ended shards if its launch ended, and forget the
        oldest of them past ``MAX_ENDED_KEPT``."""
        self._ended.pop(key, None)
        if life.phase not in ENDED:
            return
        self._ended[key] = None
        if len(self._ended) > MAX_ENDED_KEPT:
            oldest = next(iter(self._ended))
            del self._ended[oldest]
            del self._lives[oldest]

    def _life(self, replica_id: str, shard_index: int) -> _Life:
        key = (replica_id, shard_index)
        life = self._lives.get(key)
        if life is None:
            life = self._lives[key] = _Life(phase=None, launches=LAUNCHES_BEFORE_THE_CONNECTION)
        return life
