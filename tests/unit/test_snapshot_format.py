"""A fold snapshot's bytes: any fold reads back as itself, and anything else is refused."""

from __future__ import annotations

import inspect
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import app.domain.evolve
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    ModelDeclared,
    NodeRegistered,
    ReplicaPlaced,
    ShardPlacement,
)
from app.domain.evolve import _HANDLERS, replay
from app.domain.model_spec import ModelSpec
from app.domain.state import ClusterState
from app.store import snapshot_format
from app.store.errors import UnreadableSnapshot
from tests.support.generators import events, stream_for

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def folded(items: list[AnyEvent]) -> tuple[ClusterState, dict[str, int]]:
    versions: dict[str, int] = {}
    log = []
    for n, event in enumerate(items, start=1):
        stream = stream_for(event)
        versions[stream] = versions.get(stream, 0) + 1
        log.append(
            Recorded(
                position=n,
                stream=stream,
                version=versions[stream],
                event_id=uuid.uuid4(),
                recorded_at=T0 + timedelta(seconds=n),
                meta=Meta(actor="alice", epoch=n % 3 or None),
                event=event,
            )
        )
    return replay(log), versions


def same_fold(a: ClusterState, b: ClusterState) -> bool:
    return (a.position, a.nodes, a.models, a.replicas, a.keys, a.revocations) == (
        b.position, b.nodes, b.models, b.replicas, b.keys, b.revocations
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.lists(events(), min_size=1, max_size=40))
def test_any_fold_reads_back_as_itself(items: list[AnyEvent]) -> None:
    state, versions = folded(items)

    back, back_versions = snapshot_format.decode(
        state.position, snapshot_format.encode(state, versions)
    )

    assert same_fold(back, state)
    assert back_versions == versions


def test_a_large_fold_is_cut_into_chunks_that_read_back_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(snapshot_format, "PART_ENTRIES", 3)
    monkeypatch.setattr(snapshot_format, "VERSION_ENTRIES", 4)
    state, versions = folded(
        [NodeRegistered(node_id=f"gpu-{n}", address=f"127.0.0.{n}") for n in range(7)]
        + [ModelDeclared(model=m, spec=ModelSpec(name=m, command="sim")) for m in ("m1", "m2")]
        + [
            ReplicaPlaced(replica_id=f"m1-{n}", model="m1", number=n, shards=(
                ShardPlacement(index=0, node_id=f"gpu-{n % 7}", gpus=(0,), port=20000 + n),
            ))
            for n in range(1, 11)
        ]
    )  # fmt: skip

    chunks = list(snapshot_format.encode(state, versions))
    back, back_versions = snapshot_format.decode(state.position, chunks)

    assert len(chunks) == 1 + 3 + 1 + 4 + 5  # head, nodes, models, replicas, versions
    assert same_fold(back, state)
    assert list(back.replicas) == list(state.replicas)  # the order a replay gives
    assert back_versions == versions


def test_a_snapshot_of_another_fold_is_refused() -> None:
    state, versions = folded(_examples(10))
    head = msgspec.msgpack.encode(snapshot_format.Head(state.position, "an older fold"))
    chunks = [head, *list(snapshot_format.encode(state, versions))[1:]]

    with pytest.raises(UnreadableSnapshot, match="another fold"):
        snapshot_format.decode(state.position, chunks)


def test_a_snapshot_at_another_position_than_its_row_says_is_refused() -> None:
    state, versions = folded(_examples(10))

    with pytest.raises(UnreadableSnapshot, match=f"its head says position {state.position}"):
        snapshot_format.decode(state.position - 1, snapshot_format.encode(state, versions))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda chunks: chunks[1:], "does not start with its head"),
        (lambda chunks: [chunks[0], chunks[0]], "second head"),
        (lambda chunks: [chunks[0], chunks[1][:-3]], "does not decode"),
        (lambda chunks: [], "no chunks"),
    ],
)
def test_damaged_chunks_are_refused(damage: object, reason: str) -> None:
    state, versions = folded(_examples(20))
    chunks = list(snapshot_format.encode(state, versions))

    with pytest.raises(UnreadableSnapshot, match=reason):
        snapshot_format.decode(state.position, damage(chunks))  # type: ignore[operator]


def test_the_fingerprint_names_the_source_of_the_fold() -> None:
    print_ = snapshot_format.fingerprint()

    assert len(print_) == 64
    assert {m.__name__ for m in snapshot_format._FOLD_MODULES} >= {
        "app.domain.events",
        "app.domain.evolve",
        "app.domain.gpu_identity",
        "app.domain.state",
        "app.store.codec",
    }


def test_a_change_to_any_file_of_the_fold_changes_the_fingerprint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A snapshot written before a handler changed is never read by the changed fold, in
    whichever module of the fold the handler lives."""
    files = {Path(inspect.getsourcefile(handler) or "") for handler in _HANDLERS.values()}
    if hasattr(app.domain.evolve, "__path__"):
        files |= set(Path(app.domain.evolve.__path__[0]).rglob("*.py"))
    real = snapshot_format.fingerprint()
    read_bytes = Path.read_bytes
    try:
        for changed in sorted(files):

            def edited(path: Path, changed: Path = changed) -> bytes:
                source = read_bytes(path)
                return source + b"\n# edited\n" if path == changed else source

            monkeypatch.setattr(Path, "read_bytes", edited)
            snapshot_format.fingerprint.cache_clear()
            assert snapshot_format.fingerprint() != real, f"{changed} is not in the fingerprint"
    finally:
        monkeypatch.undo()
        snapshot_format.fingerprint.cache_clear()
    assert snapshot_format.fingerprint() == real


def _examples(count: int) -> list[AnyEvent]:
    found: list[AnyEvent] = []

    @settings(max_examples=count, deadline=None, database=None)
    @given(events())
    def collect(event: AnyEvent) -> None:
        found.append(event)

    collect()
    return found
