"""A fold snapshot as bytes: the state and the stream versions at one position, in chunks.

A snapshot is a sequence of msgpack chunks: first a head (the position and the fold's
fingerprint), then the nodes, models, replicas, keys, revocations and stream versions, each
map cut into parts of at most ``PART_ENTRIES`` entries. Chunks keep every row of the table
small whatever the state's size (one value in PostgreSQL holds at most 1 GB), let the
writer encode a few milliseconds at a time between appends, and let the reader decode
while the next chunk arrives.

``FINGERPRINT`` names the fold that wrote a snapshot. It is a hash of the source of every
module that decides what a replay produces: the events and their codec (upcasters
included), the state, the model spec and the modules of its parts' shapes, ``evolve`` (every
module of its package: the handlers live beside it, one module per part of the state), the
rule that says which GPU a GPU event is about (``gpu_identity``) and this format. A
snapshot is used only by a fold with the same fingerprint, so one written before an
upgrade that changed the state's shape, or changed what ``evolve`` does with an event
without changing any shape, is never read as if the new fold had written it: the first
start after such an upgrade replays the whole log once. (A number bumped by hand
would do the same until someone forgot it.)
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

import app.domain.autoscale_policy
import app.domain.envelope
import app.domain.events
import app.domain.evolve
import app.domain.gpu_identity
import app.domain.model_spec
import app.domain.revisions
import app.domain.rollout_policy
import app.domain.routing_settings
import app.domain.spec_bounds
import app.domain.state
import app.store.codec
from app.domain.state import ApiKey, CertificateRevocation, ClusterState, Model, Node, Replica
from app.store.errors import UnreadableSnapshot

PART_ENTRIES = 2_000
"""Entities per chunk: about a megabyte of replicas with their shards."""
VERSION_ENTRIES = 50_000


class Head(msgspec.Struct, frozen=True, tag="head", array_like=True):
    position: int
    fingerprint: str


class Nodes(msgspec.Struct, frozen=True, tag="nodes", array_like=True):
    entries: dict[str, Node]


class Models(msgspec.Struct, frozen=True, tag="models", array_like=True):
    entries: dict[str, Model]


class Replicas(msgspec.Struct, frozen=True, tag="replicas", array_like=True):
    entries: dict[str, Replica]


class Keys(msgspec.Struct, frozen=True, tag="keys", array_like=True):
    entries: dict[str, ApiKey]


class Revocations(msgspec.Struct, frozen=True, tag="revocations", array_like=True):
    entries: dict[str, CertificateRevocation]


class Versions(msgspec.Struct, frozen=True, tag="versions", array_like=True):
    entries: dict[str, int]


Part = Head | Nodes | Models | Replicas | Keys | Revocations | Versions

_FOLD_MODULES = (
    app.domain.autoscale_policy,
    app.domain.envelope,
    app.domain.events,
    app.domain.evolve,
    app.domain.gpu_identity,
    app.domain.model_spec,
    app.domain.revisions,
    app.domain.rollout_policy,
    app.domain.routing_settings,
    app.domain.spec_bounds,
    app.domain.state,
    app.store.codec,
    sys.modules[__name__],
)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Part)


@cache
def fingerprint() -> str:
    """The fold's fingerprint (see the module docstring)."""
    digest = hashlib.sha256()
    for name, path in _fold_files():
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _fold_files() -> list[tuple[str, Path]]:
    """The source files the fingerprint hashes, each with its module's name: a module's
    file, or every file of a package, so that a module added to ``app.domain.evolve`` changes
    the fingerprint without being listed here."""
    files: list[tuple[str, Path]] = []
    for module in _FOLD_MODULES:
        assert module.__file__ is not None  # modules loaded from files, not built in
        path = Path(module.__file__)
        if not hasattr(module, "__path__"):
            files.append((module.__name__, path))
            continue
        for source in sorted(path.parent.rglob("*.py")):
            parts = source.relative_to(path.parent).with_suffix("").parts
            files.append((".".join((module.__name__, *parts)), source))
    return files


def encode(state: ClusterState, versions: dict[str, int]) -> Iterator[bytes]:
    """The chunks of a snapshot of ``state``, one at a time. ``state`` must not change while
    they are taken: pass a ``copy()``."""
    yield _encoder.encode(Head(state.position, fingerprint()))
    yield from _parts(Nodes, state.nodes, PART_ENTRIES)
    yield from _parts(Models, state.models, PART_ENTRIES)
    yield from _parts(Replicas, state.replicas, PART_ENTRIES)
    yield from _parts(Keys, state.keys, PART_ENTRIES)
    yield from _parts(Revocations, state.revocations, PART_ENTRIES)
    yield from _parts(Versions, versions, VERSION_ENTRIES)


def _parts(kind: Any, entries: dict[str, Any], size: int) -> Iterator[bytes]:
    items = list(entries.items())
    for start in range(0, len(items), size):
        yield _encoder.encode(kind(dict(items[start : start + size])))


class Decoding:
    """A snapshot being read, chunk by chunk; ``result()`` once every chunk is in."""

    def __init__(self, position: int) -> None:
        self.position = position
        self.state = ClusterState()
        self.versions: dict[str, int] = {}
        self._head = False

    def add(self, chunk: bytes) -> None:
        try:
            part = _decoder.decode(chunk)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UnreadableSnapshot(self.position, f"a chunk does not decode: {exc}") from exc
        if not self._head:
            if not isinstance(part, Head):
                raise UnreadableSnapshot(self.position, "it does not start with its head")
            if part.position != self.position:
                raise UnreadableSnapshot(self.position, f"its head says position {part.position}")
            if part.fingerprint != fingerprint():
                raise UnreadableSnapshot(self.position, "it was written by another fold")
            self._head = True
            return
        state = self.state
        match part:
            case Head():
                raise UnreadableSnapshot(self.position, "it has a second head")
            case Nodes():
                state.nodes.update(part.entries)
            case Models():
                state.models.update(part.entries)
            case Replicas():
                state.replicas.update(part.entries)
            case Keys():
                state.keys.update(part.entries)
            case Revocations():
                state.revocations.update(part.entries)
            case Versions():
                self.versions.update(part.entries)

    def result(self) -> tuple[ClusterState, dict[str, int]]:
        if not self._head:
            raise UnreadableSnapshot(self.position, "it has no chunks")
        self.state.position = self.position
        return self.state, self.versions


def decode(position: int, chunks: Iterable[bytes]) -> tuple[ClusterState, dict[str, int]]:
    decoding = Decoding(position)
    for chunk in chunks:
        decoding.add(chunk)
    return decoding.result()
