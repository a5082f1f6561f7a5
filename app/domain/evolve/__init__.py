"""The fold: ``evolve(state, recorded) -> state``, the only place state changes.

The same function builds the control plane's view at start-up and the SQL projection
rows, so the two cannot disagree. It updates ``state``'s maps in place and returns it: a
replay folds a million events and cannot afford to copy four maps per event. Entities are
frozen and replaced, never mutated, so anyone holding one (or a ``state.copy()``) keeps a
consistent picture. Events about an entity the state does not know leave it unchanged.

The fold keeps the live cluster, not its whole history: once more than
``ENDED_KEPT_PER_MODEL`` replicas of a model have ended, the one that ended first is
forgotten (``replicas._keep_ended``), so the state, its snapshots and a start-up stay the
size of the cluster however long the log. Events about a forgotten replica leave the state
unchanged, like events about one it never knew.

The handlers live beside this module, one module per part of the state: ``shards``,
``replicas``, ``nodes`` (with their GPUs), ``models``, ``rollouts`` and ``credentials`` (API
keys and certificates), with ``updates``, how each replaces an entity it changes. Each
names the events it folds in its ``HANDLERS``; ``_HANDLERS`` below joins them into one
table.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.domain.envelope import Recorded
from app.domain.events import Event
from app.domain.evolve import credentials, models, nodes, replicas, rollouts, shards
from app.domain.evolve.updates import Handler
from app.domain.state import ClusterState


def replay(events: Iterable[Recorded], state: ClusterState | None = None) -> ClusterState:
    """Fold ``events`` into ``state`` (a fresh one by default)."""
    state = state if state is not None else ClusterState()
    for recorded in events:
        evolve(state, recorded)
    return state


def evolve(state: ClusterState, recorded: Recorded) -> ClusterState:
    state.position = recorded.position
    event = recorded.event
    _HANDLERS[type(event)](state, event, recorded)
    return state


def _one_table(*tables: dict[type[Event], Handler]) -> dict[type[Event], Handler]:
    """The modules' tables in one; an event two modules claim to fold is a mistake."""
    merged: dict[type[Event], Handler] = {}
    for table in tables:
        twice = merged.keys() & table.keys()
        if twice:
            raise TypeError(f"folded twice: {sorted(t.__name__ for t in twice)}")
        merged |= table
    return merged


# A table rather than a ``match``: a replay folds a million events, and a match tries its
# cases in order (some 0.2 us each); the table is one lookup. That every event type has a
# handler is checked by tests/unit/test_fold.py instead of by assert_never.
_HANDLERS = _one_table(
    shards.HANDLERS,
    replicas.HANDLERS,
    nodes.HANDLERS,
    models.HANDLERS,
    rollouts.HANDLERS,
    credentials.HANDLERS,
)
