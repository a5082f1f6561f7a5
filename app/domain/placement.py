"""Placement: every node checked against every filter, the survivors scored, reasons in words.

Filters (all evaluated for every node, so an explanation lists every reason, not only the
first): connected; not cordoned; not draining; labels match the model's selector; enough
healthy, unallocated GPUs no operator cordoned (``app.domain.gpu_cordons``), whose UUID no
other node holds (``app.domain.gpu_claims``), with enough free memory (as the node last
reported it: ``Allocations.free_mib``); a free port in the node's engine port range,
skipping a port where a shard failed because a process that is not our engine listens there
(``Node.ports_held_elsewhere``, until the node's next hello). Shards of one replica go to
distinct nodes.

Score among the eligible nodes, best first (documented in docs/reconciler.md):
1. away from failure: fewer of the model's replicas failed on the node since one last
   served (``Model.failed_on``), so a node that cannot run it (the model's file missing
   there) does not take every attempt while another node has room;
2. spread: fewer replicas of the same model already on the node;
3. pack: fewer usable GPUs left over after this shard (best fit keeps big holes for big
   models);
4. the node id, so equal nodes are always chosen in the same order.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from enum import StrEnum

import msgspec

from app.domain.allocation import NOTHING_REPORTED, Allocations
from app.domain.events import ShardPlacement
from app.domain.gpu_claims import held_elsewhere_reason
from app.domain.gpu_cordons import cordon_of, cordon_text
from app.domain.model_spec import ModelSpec
from app.domain.reports import NodeReport
from app.domain.state import ClusterState, Node

MIB_PER_GIB = 1024


class Rejection(StrEnum):
    """Why a node cannot take a shard, in the order the checks run (``_evaluate``)."""

    NOT_CONNECTED = "not connected"
    CORDONED = "cordoned"
    DRAINING = "draining"
    LABELS = "labels do not match"
    GPUS = "not enough healthy free GPUs"
    PORTS = "no free port"


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    eligible: bool
    reasons: tuple[str, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    gpus: tuple[int, ...] = ()
    port: int | None = None
    same_model_replicas: int = 0
    usable_gpus: int = 0
    failures_here: int = 0
    """The model's replicas that failed on this node since one last served."""
    ports_skipped: tuple[int, ...] = ()
    """Ports of its range passed over because another process holds them
    (``Node.ports_held_elsewhere``); set by the explanation only."""


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    shards: int
    gpus_per_shard: int
    gpu_memory_gib: float
    candidates: tuple[Candidate, ...]
    placement: tuple[ShardPlacement, ...] | None
    summary: str


def explain_placement(
    state: ClusterState,
    spec: ModelSpec,
    allocations: Allocations | None = None,
    *,
    running: Mapping[str, NodeReport] = NOTHING_REPORTED,
    detail: bool = True,
) -> Explanation:
    """Where one more replica of ``spec`` would go, and why every other node would not.

    Without ``allocations``, what the reconciler holds (``Allocations.for_placement``): the
    log's active replicas and the engines each connected node reports ``running``.
    ``detail=False`` skips the per-GPU wording (the reconciler's fast path)."""
    if allocations is None:
        allocations = Allocations.for_placement(state, running)
    failed_on = _failed_on(state, spec)
    candidates = tuple(
        _evaluate(node, spec, allocations, detail, failed_on)
        for node in sorted(state.nodes.values(), key=lambda n: n.id)
    )
    eligible = sorted(
        (c for c in candidates if c.eligible), key=lambda c: rank(c, spec.gpus_per_shard)
    )
    placement: tuple[ShardPlacement, ...] | None = None
    if len(eligible) >= spec.shards_per_replica:
        chosen = eligible[: spec.shards_per_replica]
        placement = tuple(
            ShardPlacement(index=i, node_id=c.node_id, gpus=c.gpus, port=c.port or 0)
            for i, c in enumerate(chosen)
        )
        summary = _chosen_summary(chosen, len(eligible))
    else:
        summary = unplaceable_summary(spec, candidates)
    return Explanation(
        model=spec.name,
        shards=spec.shards_per_replica,
        gpus_per_shard=spec.gpus_per_shard,
        gpu_memory_gib=spec.gpu_memory_gib,
        candidates=candidates,
        placement=placement,
        summary=summary,
    )


def rank(candidate: Candidate, gpus_per_shard: int) -> tuple[int, int, int, str]:
    """Best first: fewest failures of this model since one served, then fewest replicas of
    this model, then tightest fit, then node id."""
    return (
        candidate.failures_here,
        candidate.same_model_replicas,
        candidate.usable_gpus - gpus_per_shard,
        candidate.node_id,
    )


class Placer:
    """Places replicas of one model one after another in a reconcile pass: every node is
    evaluated once, and after each placement only the nodes it used are evaluated again."""

    def __init__(self, state: ClusterState, spec: ModelSpec, allocations: Allocations) -> None:
        self._state = state
        self._spec = spec
        self._allocations = allocations
        self._key = lambda c: rank(c, spec.gpus_per_shard)
        self._failed_on = _failed_on(state, spec)
        fit = (_fit(node, spec, allocations, self._failed_on) for node in state.nodes.values())
        self._ranked = sorted((c for c in fit if c is not None), key=self._key)

    def place(self, replica_id: str) -> tuple[ShardPlacement, ...] | None:
        need = self._spec.shards_per_replica
        if len(self._ranked) < need:
            return None
        chosen, self._ranked = self._ranked[:need], self._ranked[need:]
        placement = tuple(
            ShardPlacement(index=i, node_id=c.node_id, gpus=c.gpus, port=c.port or 0)
            for i, c in enumerate(chosen)
        )
        self._allocations.reserve(replica_id, self._spec.name, placement)
        for used in chosen:
            again = _fit(
                self._state.nodes[used.node_id], self._spec, self._allocations, self._failed_on
            )
            if again is not None:
                bisect.insort(self._ranked, again, key=self._key)
        return placement

    def summary(self) -> str:
        """Why no (more) replica fits, every node counted (``unplaceable_summary``)."""
        candidates = tuple(
            _evaluate(node, self._spec, self._allocations, False, self._failed_on)
            for node in self._state.nodes.values()
        )
        return unplaceable_summary(self._spec, candidates)


SEVERAL_CHECKS_FAILED = "each node counted once, under the first check it fails"
"""Said after the counts when a node failed more than one check: the counts add up to the
nodes, and ``explain_placement`` lists every reason of each."""


def unplaceable_summary(spec: ModelSpec, candidates: tuple[Candidate, ...]) -> str:
    """One stable line: the same situation always gives the same words (the reconciler
    records a model's reason only when it changes). Each node not eligible is counted once,
    under the first check it fails, so the counts add up to the nodes."""
    eligible = sum(1 for c in candidates if c.eligible)
    need = f"{spec.shards_per_replica} node(s) with {spec.gpus_per_shard} healthy free GPU(s)" + (
        f" of {spec.gpu_memory_gib:g} GiB" if spec.gpu_memory_gib else ""
    )
    if not candidates:
        return f"needs {need}: no nodes are registered"
    refused = [c for c in candidates if c.rejections]
    counts = Counter(c.rejections[0] for c in refused)
    parts = ", ".join(f"{counts[reason]} {reason.value}" for reason in Rejection if counts[reason])
    several = any(len(c.rejections) > 1 for c in refused)
    return f"needs {need}, {eligible} eligible of {len(candidates)}: {parts}" + (
        f"; {SEVERAL_CHECKS_FAILED}" if several else ""
    )


def _chosen_summary(chosen: list[Candidate], eligible: int) -> str:
    where = ", ".join(
        f"{c.node_id} (GPUs {','.join(map(str, c.gpus))}, port {c.port}, "
        f"{c.same_model_replicas} replica(s) of this model there, "
        f"{c.usable_gpus} usable GPU(s)"
        + (f", {c.failures_here} failed there since one served" if c.failures_here else "")
        + (f", {_skipped(c.ports_skipped)}" if c.ports_skipped else "")
        + ")"
        for c in chosen
    )
    return (
        f"would place on {where}; {eligible} eligible node(s), ranked by fewest failures of "
        "this model since one served, then fewest replicas of this model, then tightest fit, "
        "then node id"
    )


def _skipped(ports: tuple[int, ...]) -> str:
    listed = ", ".join(map(str, ports))
    return f"port {listed} skipped: held by a process that is not our engine"


def _held_in_range(node: Node) -> tuple[int, ...]:
    low, high = node.port_range
    return tuple(sorted(port for port in node.ports_held_elsewhere if low <= port <= high))


def _failed_on(state: ClusterState, spec: ModelSpec) -> Mapping[str, int]:
    model = state.models.get(spec.name)
    return model.failed_on if model is not None else {}


def _evaluate(
    node: Node,
    spec: ModelSpec,
    allocations: Allocations,
    detail: bool,
    failed_on: Mapping[str, int],
) -> Candidate:
    reasons: list[str] = []
    rejections: list[Rejection] = []

    def reject(kind: Rejection, text: str) -> None:
        rejections.append(kind)
        reasons.append(text)

    if not node.connected:
        reject(Rejection.NOT_CONNECTED, "not connected" + (" (lost)" if node.lost else ""))
    if node.drain_id is not None:
        reject(Rejection.DRAINING, f"draining (drain {node.drain_id})")
    elif node.cordoned:
        reject(
            Rejection.CORDONED,
            "cordoned" + (f" ({node.cordon_reason})" if node.cordon_reason else ""),
        )
    mismatched = [
        f"{key}={value} (node has {node.labels.get(key, 'none')})"
        for key, value in sorted(spec.node_selector.items())
        if node.labels.get(key) != value
    ]
    if mismatched:
        reject(Rejection.LABELS, "labels do not match: needs " + ", ".join(mismatched))

    usable, notes = _usable_gpus(node, spec, allocations, detail)
    if len(usable) < spec.gpus_per_shard:
        memory = f" with {spec.gpu_memory_gib:g} GiB free" if spec.gpu_memory_gib else ""
        text = f"needs {spec.gpus_per_shard} healthy GPU(s){memory}, has {len(usable)}"
        reject(Rejection.GPUS, text + (": " + ", ".join(notes) if notes else ""))

    port = allocations.free(node)[1]
    skipped = _held_in_range(node)
    if port is None:
        low, high = node.port_range
        held = f" ({_skipped(skipped)})" if skipped else ""
        reject(Rejection.PORTS, f"no free port in {low}-{high}{held}")

    return Candidate(
        node_id=node.id,
        eligible=not rejections,
        reasons=tuple(reasons),
        rejections=tuple(rejections),
        gpus=tuple(usable[: spec.gpus_per_shard]),
        port=port,
        same_model_replicas=allocations.model_replicas.get(node.id, {}).get(spec.name, 0),
        usable_gpus=len(usable),
        failures_here=failed_on.get(node.id, 0),
        ports_skipped=skipped,
    )


def _fit(
    node: Node, spec: ModelSpec, allocations: Allocations, failed_on: Mapping[str, int]
) -> Candidate | None:
    """``_evaluate`` for the reconciler's hot path: the candidate if the node is eligible,
    else None, stopping at the first failed check."""
    if not node.connected or node.cordoned:
        return None
    labels = node.labels
    for key, value in spec.node_selector.items():
        if labels.get(key) != value:
            return None
    port = allocations.free(node)[1]
    if port is None:
        return None
    usable = _usable(node, spec, allocations)
    if len(usable) < spec.gpus_per_shard:
        return None
    return Candidate(
        node_id=node.id,
        eligible=True,
        gpus=tuple(usable[: spec.gpus_per_shard]),
        port=port,
        same_model_replicas=allocations.model_replicas.get(node.id, {}).get(spec.name, 0),
        usable_gpus=len(usable),
        failures_here=failed_on.get(node.id, 0),
    )


def _usable(node: Node, spec: ModelSpec, allocations: Allocations) -> list[int]:
    """Healthy, unallocated GPUs with the memory the model needs: the one rule both the
    explanation and the reconciler's fast path apply."""
    need_mib = spec.gpu_memory_gib * MIB_PER_GIB
    return [index for index, free_mib in allocations.free(node)[0] if free_mib >= need_mib]


def _usable_gpus(
    node: Node, spec: ModelSpec, allocations: Allocations, detail: bool
) -> tuple[list[int], list[str]]:
    """The usable GPUs and, with ``detail``, why each other GPU is not."""
    usable = _usable(node, spec, allocations)
    if not detail:
        return usable, []
    held = allocations.gpus.get(node.id, {})
    elsewhere = allocations.held_elsewhere.get(node.id, {})
    notes: list[str] = []
    for gpu in node.gpus:
        if gpu.index in usable:
            continue
        cordon = cordon_of(node, gpu)
        if gpu.index in elsewhere:
            reason = held_elsewhere_reason(gpu.uuid, elsewhere[gpu.index])
            notes.append(f"GPU {gpu.index} held elsewhere ({reason})")
        elif not gpu.healthy:
            notes.append(f"GPU {gpu.index} unhealthy ({gpu.unhealthy_reason or 'no reason'})")
        elif cordon is not None:
            notes.append(cordon_text(gpu.index, cordon))
        elif gpu.index in held:
            notes.append(f"GPU {gpu.index} used by {held[gpu.index]}")
        else:
            free = allocations.free_mib(node.id, gpu) / MIB_PER_GIB
            notes.append(f"GPU {gpu.index} has {free:.0f} GiB free")
    return usable, notes
