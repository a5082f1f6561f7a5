"""Hypothesis strategies for events, derived from their msgspec type information.

Ids come from small pools, so generated sequences keep hitting the same models, nodes and
replicas and exercise real transitions rather than events about strangers.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
from hypothesis import strategies as st
from msgspec import inspect as mi
from msgspec.structs import replace

from app.domain.events import (
    EVENT_TYPES,
    AnyEvent,
    ApiKeyCreated,
    CertificateRevoked,
    Event,
    ModelDeclared,
    NodeConnected,
    NodeRegistered,
    ReplicaFailed,
    ReplicaLost,
    ReplicaPlaced,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    RolloutHoldEjectionSeen,
    ShardPlacement,
    StrayStopped,
    subjects,
)
from app.domain.keys import MAX_LIMIT
from app.domain.model_spec import (
    MAX_REPLICAS,
    MAX_STARTUP_TIMEOUT_S,
    MAX_TARGET_WAITING,
    MAX_WEIGHT,
    MIN_WEIGHT,
    ModelSpec,
)
from app.domain.revisions import SpecChange
from app.domain.state import ENDED_KEPT_PER_MODEL

MODELS = ("llama", "qwen")
NODES = ("gpu-1", "gpu-2", "gpu-3")
REPLICAS = tuple(f"{m}-{n}" for m in MODELS for n in (1, 2, 3))
KEYS = ("k1", "k2")

_IDS: dict[str, st.SearchStrategy[str]] = {
    "model": st.sampled_from(MODELS),
    "name": st.sampled_from(MODELS),
    "node_id": st.sampled_from(NODES),
    "claimed_node_id": st.sampled_from(NODES),
    "replica_id": st.sampled_from(REPLICAS),
    "replacement_id": st.sampled_from(REPLICAS),
    "replaces": st.sampled_from(REPLICAS),
    "key_id": st.sampled_from(KEYS),
    # A certificate's serial names its stream: hex, as the CA issues and the API checks.
    "serial": st.text("0123456789abcdef", min_size=1, max_size=40),
}
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
EXTREME_FLOATS = (
    0.0,
    -0.0,
    5e-324,
    1e-300,
    MIN_WEIGHT,
    1.0,
    float(MAX_WEIGHT),
    float(MAX_STARTUP_TIMEOUT_S),
    2.0**53 + 2,
    1.2345678901234567e300,
    sys.float_info.max,
)
"""The edges of what the API accepts, and far past them, as a log written before specs
were bounded may hold: each must rebuild to the very rows it was projected to."""
EXTREME_INTS = (0, 1, MAX_REPLICAS, MAX_TARGET_WAITING, MAX_LIMIT)
_moments = st.datetimes(
    min_value=datetime(1971, 1, 1),
    max_value=datetime(2999, 12, 31),
    timezones=st.sampled_from(
        [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
    ),
)
"""Times with their offset (as the admin API takes them), each a time PostgreSQL keeps to
the microsecond and gives back as the same instant in UTC."""
_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-1000, 1000), st.floats(-1e6, 1e6), _text
)


def _for_type(info: mi.Type, field: str) -> st.SearchStrategy[Any]:
    match info:
        case mi.StrType():
            return _IDS.get(field, _text)
        case mi.IntType():
            if field in {"index", "shard_index"}:
                return st.integers(0, 3)
            return st.sampled_from(EXTREME_INTS) | st.integers(0, 30000)
        case mi.FloatType():
            finite = st.floats(0, 1e5, allow_nan=False, allow_infinity=False)
            return st.sampled_from(EXTREME_FLOATS) | finite
        case mi.BoolType():
            return st.booleans()
        case mi.DateTimeType():
            return _moments
        case mi.LiteralType(values=values):
            return st.sampled_from(values)
        case mi.NoneType():
            return st.none()
        case mi.UnionType(types=types):
            return st.one_of(*(_for_type(t, field) for t in types))
        case mi.VarTupleType(item_type=item) | mi.ListType(item_type=item):
            return st.lists(_for_type(item, field), max_size=3).map(tuple)
        case mi.TupleType(item_types=items):
            return st.tuples(*(_for_type(t, field) for t in items))
        case mi.DictType(key_type=key, value_type=value):
            return st.dictionaries(_for_type(key, ""), _for_type(value, ""), max_size=3)
        case mi.AnyType():
            return st.dictionaries(_text, _json_scalars, max_size=3)
        case mi.StructType(cls=cls):
            return struct_strategy(cls)
    raise NotImplementedError(f"no strategy for {info!r} ({field})")


def struct_strategy(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {f.name: _for_type(f.type, f.name) for f in info.fields}
    return st.fixed_dictionaries(fields).map(lambda values: cls(**values))


def events() -> st.SearchStrategy[AnyEvent]:
    classes: list[type[Event]] = list(EVENT_TYPES.values())
    return st.one_of(*(struct_strategy(cls) for cls in classes)).map(_valid)


def _valid(event: AnyEvent) -> AnyEvent:
    """Invariants the deciders guarantee: shards and GPUs numbered 0..n-1, key prefixes unique."""
    if isinstance(event, ReplicaPlaced):
        shards = tuple(replace(s, index=i) for i, s in enumerate(event.shards))
        return replace(event, shards=shards)
    if isinstance(event, ApiKeyCreated):  # prefixes identify keys: unique by construction
        return replace(event, prefix=f"llmgw_{event.key_id}")
    if isinstance(event, CertificateRevoked):  # a revocation names a serial or a node
        if event.serial:
            return replace(event, node_id=None)
        return replace(event, serial=None, node_id=event.node_id or NODES[0])
    if isinstance(event, NodeRegistered | NodeConnected):  # an agent reports each GPU once
        gpus = tuple(replace(g, index=i) for i, g in enumerate(event.gpus))
        return replace(event, gpus=gpus)
    return event


def stream_for(event: AnyEvent) -> str:
    """The stream an event of this kind belongs to: its replica's, key's, node's,
    certificate's or model's, in that order; a stopped stray is on its node's, and a
    replica ejected during a rollout's hold on its model's, where the reconciler records
    it (``app.domain.hold_ejections``)."""
    about = subjects(event)
    on_its_replica = not isinstance(event, StrayStopped | RolloutHoldEjectionSeen)
    replica = about.replica if on_its_replica else None
    for prefix, value in (
        ("replica", replica),
        ("key", about.key),
        ("node", about.node),
        ("certificate", about.certificate),
        ("model", about.model),
    ):
        if value is not None:
            return f"{prefix}-{value}"
    raise AssertionError(f"no stream for {event!r}")


_ENDS = (
    lambda replica_id: ReplicaStopped(replica_id=replica_id),
    lambda replica_id: ReplicaFailed(replica_id=replica_id, reason="shard 0 failed"),
    lambda replica_id: ReplicaStartupTimedOut(replica_id=replica_id, timeout_s=60, waited_s=61),
    lambda replica_id: ReplicaLost(replica_id=replica_id, reason="node gpu-1 lost"),
)


@st.composite
def churn(draw: st.DrawFn) -> list[list[AnyEvent]]:
    """Batches in which one model's replicas are placed and end, often more than the fold
    keeps (``ENDED_KEPT_PER_MODEL``), so that it forgets the first ones (or one fewer, or as
    many: then it forgets none). They are numbered
    from 1, so the generated events of other batches speak of forgotten replicas too. The
    model gets a second revision on the way (its command changes), and the replicas placed
    after it carry that revision, while those before keep the first; some of those placed
    first are still running then, and some end only after it."""
    model = draw(st.sampled_from(MODELS))
    count = draw(st.integers(ENDED_KEPT_PER_MODEL - 1, ENDED_KEPT_PER_MODEL + 4))
    revised_before = draw(st.integers(1, count))
    spec = ModelSpec(name=model, command="sim --port {port}", replicas=1)
    revised = replace(spec, command="sim --port {port} --fast")
    batches: list[list[AnyEvent]] = [[ModelDeclared(model=model, spec=spec)]]
    revision = 1
    running_end: AnyEvent | None = None
    for number in range(1, count + 1):
        if number == revised_before:
            revision = 2
            change = SpecChange(field="command", old=spec.command, new=revised.command)
            batches.append(
                [ModelDeclared(model=model, spec=revised, revision=2, changes=(change,))]
            )
            if running_end is not None:  # placed with revision 1, ends under revision 2
                batches.append([running_end])
        replica_id = f"{model}-{number}"
        placement = ShardPlacement(
            index=0, node_id=draw(st.sampled_from(NODES)), gpus=(0,), port=20000
        )
        placed = ReplicaPlaced(
            replica_id=replica_id,
            model=model,
            number=number,
            shards=(placement,),
            revision=revision,
        )
        end = draw(st.sampled_from(_ENDS))(replica_id)
        if number == revised_before - 1:
            batches.append([placed])
            running_end = end
        else:
            batches.append([placed, end])
    return batches


@st.composite
def histories(
    draw: st.DrawFn, batches: st.SearchStrategy[list[list[AnyEvent]]]
) -> list[list[AnyEvent]]:
    """Generated ``batches`` with a ``churn`` woven in, each in its own order."""
    generated, churned = draw(batches), draw(churn())
    history: list[list[AnyEvent]] = []
    while generated or churned:
        source = churned if not generated or (churned and draw(st.booleans())) else generated
        history.append(source.pop(0))
    return history
