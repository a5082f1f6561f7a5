"""``/metrics``: the cluster in Prometheus text, read where each figure lives at scrape time.

Served without authentication on the admin listener, like ``/healthz``: scrapers are rarely
given client certificates, and nothing here is secret or writable (counts, model names,
node ids, phases and placement reasons; never a key, a token, a spec or an address). An
operator who wants it closed puts the admin listener behind the network policy that
already guards it.

Figures come from three places, none of them counters sprinkled through the code:

- the log's fold (the store's in-memory state, the same fold the projection tables hold):
  replicas by model and phase, each model's desired and serving replicas, nodes by
  connection, GPUs by health, each node's GPUs whose UUID another node holds, drains in
  progress, and, for each model that cannot place a replica, the nodes rejected for each
  reason;
- the ``events`` table: events appended by type, counted incrementally by position (appends
  are serialized, so no event can appear later below a position already counted);
- the leader's live parts (``LiveFigures``): agents connected to this server's hub and
  when the first of their certificates ends, connections it refused before their TLS
  handshake and handshakes it refused on the node certificate, hellos it refused because
  their node's connection still answered (4005), the reconciler's recent passes, the
  demand its autoscaler last sampled for each autoscaled model, and the gateways its last
  pass read as reporting or silent. A standby reports no leader, no agents, no demand and
  no gateways;
- the certificates this server presents and trusts, read when it started: when each ends
  (``app.pki.ends``);
- the gateway this process runs, if any (``llmgw_gateway_*``, see docs/gateway.md): its
  page names every model and replica, so ``serve`` publishes it here, to operators, and
  its client listener answers 404 for ``/metrics``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from litestar import Response, get
from litestar.di import NamedDependency
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.domain.allocation import NOTHING_REPORTED, Allocations
from app.domain.gpu_claims import held_elsewhere_counts
from app.domain.placement import Rejection, explain_placement
from app.domain.reports import NodeReport
from app.domain.state import ACTIVE_PHASES, COUNTING_PHASES, ClusterState, ReplicaPhase
from app.listeners.refusals import ListenerCollector, ListenerRefusals
from app.pki.ends import CertificateEnd
from app.services.control_plane import ControlPlane, Leader, Role
from app.services.operations import RunningSource, nothing_running
from app.services.reconciler import PASSES_KEPT
from app.store.database import connection
from app.store.postgres import PostgresEventStore

QUANTILES = (0.5, 0.9, 0.99, 1.0)
LISTENER_FAMILIES = "llmgw_admin_listener"
"""``_refusals`` and ``_idle_closed`` (``app.listeners.refusals``): the admin listener's."""
MEDIA_TYPE = "text/plain; version=0.0.4"
"""The classic text format every Prometheus reads (Litestar adds the charset)."""


@dataclass(frozen=True)
class LiveFigures:
    """What only the leading server knows: its agent connections, reconcile passes, and the
    demand its autoscaler last sampled, by model."""

    agents_connected: int
    reconcile_passes: int
    recent_pass_durations_s: Sequence[float]
    reconcile_pass_seconds_total: float = 0.0
    """How long every pass since this server began leading took, added up."""
    demand: Mapping[str, float] = field(default_factory=dict)
    gateways_reporting: int = 0
    """Gateways whose reports the last pass read as fresh."""
    gateways_silent: int = 0
    """Gateways the last pass found silent: reported before, not recently, and not gone
    cleanly (``app.domain.reports.GatewaysInFlight.silent``)."""
    agent_handshakes_refused: int = 0
    """Agent connections the hub closed before their TLS handshake: their address had as
    many handshakes in progress as it may (``app.hub.gate``)."""
    agent_certificates_refused: int = 0
    """Agent TLS handshakes that failed on the node certificate: expired, not yet valid, not
    issued by the CA (``app.hub.accepting``)."""
    agent_hellos_connected_elsewhere: int = 0
    """Agent hellos the hub refused because their node's connection still answered: two
    agents run with one node's certificate (``app.hub.refusals``)."""
    earliest_agent_certificate_end: datetime | None = None
    """When the first of the connected agents' certificates ends; None with none connected."""


LiveSource = Callable[[], LiveFigures | None]
"""The leader's figures now; None while this server does not lead."""


def control_plane_running(control_plane: ControlPlane) -> RunningSource:
    """What each node connected to this server reports running, while it leads."""

    def read() -> Mapping[str, NodeReport]:
        leader = control_plane.leader
        if control_plane.role is not Role.LEADER or leader is None:
            return {}
        return leader.tracker.snapshot().reports

    return read


def control_plane_figures(control_plane: ControlPlane) -> LiveSource:
    def read() -> LiveFigures | None:
        leader = control_plane.leader
        if control_plane.role is not Role.LEADER or leader is None:
            return None
        return leader_figures(leader)

    return read


def leader_figures(leader: Leader) -> LiveFigures:
    """What a leadership term knows now."""
    reconciler = leader.reconciler
    return LiveFigures(
        agents_connected=len(leader.hub.connected_nodes()),
        reconcile_passes=reconciler.pass_count if reconciler else 0,
        recent_pass_durations_s=[p.duration_s for p in reconciler.passes] if reconciler else [],
        reconcile_pass_seconds_total=reconciler.pass_seconds_total if reconciler else 0.0,
        demand=reconciler.last_demand() if reconciler else {},
        gateways_reporting=reconciler.gateways.live if reconciler else 0,
        gateways_silent=reconciler.gateways.silent if reconciler else 0,
        agent_handshakes_refused=leader.hub.handshakes_refused(),
        agent_certificates_refused=leader.hub.certificates_refused(),
        agent_hellos_connected_elsewhere=leader.hub.connected_elsewhere(),
        earliest_agent_certificate_end=leader.hub.earliest_certificate_end(),
    )


class EventCounts:
    """Events in the log by type, read incrementally: each scrape counts only new ones."""

    def __init__(self, store: PostgresEventStore) -> None:
        self._store = store
        self._lock = asyncio.Lock()
        self.by_type: Counter[str] = Counter()
        self.position = 0

    async def refresh(self) -> None:
        async with self._lock, connection(self._store.engine) as db:
            rows = await db.fetch(
                "SELECT type, count(*) AS n, max(position) AS last FROM events "
                "WHERE position > $1 GROUP BY type",
                self.position,
            )
            for row in rows:
                self.by_type[row["type"]] += row["n"]
                self.position = max(self.position, row["last"])


FoldSource = Callable[[], ClusterState]
"""The store's fold now."""
EventCountSource = Callable[[], Mapping[str, int]]
"""Events in the log by type, as last counted."""


class ClusterCollector(Collector):
    """Yields the families from the current fold, event counts and live figures."""

    def __init__(
        self,
        state: FoldSource,
        counts: EventCountSource,
        live: LiveSource,
        running: RunningSource = nothing_running,
        certificates: Sequence[CertificateEnd] = (),
    ) -> None:
        self._state = state
        self._counts = counts
        self._live = live
        self._running = running
        self._certificates = certificates

    def collect(self) -> Iterator[Metric]:
        yield from live_families(self._live())
        yield event_family(self._counts())
        yield from fold_families(self._state(), self._running())
        yield certificate_family(self._certificates)


GatewayPage = Callable[[], bytes]
"""The ``/metrics`` text of the gateway in this process."""


class ClusterMetrics:
    """The ``/metrics`` page: its own registry, nothing global."""

    def __init__(
        self,
        store: PostgresEventStore,
        live: LiveSource | None = None,
        gateway: GatewayPage | None = None,
        running: RunningSource = nothing_running,
        certificates: Sequence[CertificateEnd] = (),
        listener_refusals: ListenerRefusals | None = None,
    ) -> None:
        """``running``: what each connected node reports running, held from placement as
        the reconciler holds it (``placement_families``); ``certificates``: when those the
        server presents and trusts end; ``listener_refusals``: what the admin listener
        refused itself, before any request reached the API, and the silent connections it
        closed."""
        self._store = store
        self._gateway = gateway
        self._counts = EventCounts(store)
        self.registry = CollectorRegistry(auto_describe=False)
        counts = self._counts
        collector = ClusterCollector(
            lambda: store.state,
            lambda: counts.by_type,
            live or (lambda: None),
            running,
            certificates,
        )
        self.registry.register(collector)
        if listener_refusals is not None:
            self.registry.register(ListenerCollector(LISTENER_FAMILIES, [listener_refusals]))

    async def render(self) -> bytes:
        await self._store.catch_up()
        await self._counts.refresh()
        # Synchronous from here: the fold cannot move while the page is written.
        page = generate_latest(self.registry)
        # Its families are all llmgw_gateway_*: the two pages join without a clash.
        return page + self._gateway() if self._gateway is not None else page


def certificate_family(ends: Sequence[CertificateEnd]) -> Metric:
    """When each certificate this server presents (``agent_hub``, ``admin``) or trusts
    (``ca``) ends, by serial: its subject could be an address, which this page never
    shows."""
    family = GaugeMetricFamily(
        "llmgw_certificate_expiry_timestamp_seconds",
        "When each certificate this server presents or trusts ends (its not_after, Unix "
        "seconds), as read when it started: past it, agents and operators refuse this server",
        labels=["certificate", "serial"],
    )
    for end in ends:
        family.add_metric([str(end.role), end.serial], end.not_after.timestamp())
    return family


def live_families(figures: LiveFigures | None) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "llmgw_leader",
        "1 while this server leads the cluster",
        value=1 if figures is not None else 0,
    )
    yield GaugeMetricFamily(
        "llmgw_agents_connected",
        "Agents connected to this server's hub (0 on a standby)",
        value=figures.agents_connected if figures else 0,
    )
    yield CounterMetricFamily(
        "llmgw_agent_handshakes_refused",
        "Agent connections this server's hub closed before their TLS handshake, since it "
        "began leading: their address had --agent-handshakes-per-address in progress",
        value=figures.agent_handshakes_refused if figures else 0,
    )
    yield CounterMetricFamily(
        "llmgw_agent_certificates_refused",
        "Agent TLS handshakes this server's hub refused on the node certificate, since it "
        "began leading: expired, not yet valid, or not issued by its CA",
        value=figures.agent_certificates_refused if figures else 0,
    )
    yield CounterMetricFamily(
        "llmgw_agent_hellos_connected_elsewhere",
        "Agent hellos this server's hub refused (4005) since it began leading: their node's "
        "connection still answered, two agents running with one node's certificate",
        value=figures.agent_hellos_connected_elsewhere if figures else 0,
    )
    earliest = figures.earliest_agent_certificate_end if figures else None
    yield GaugeMetricFamily(
        "llmgw_agent_certificate_earliest_expiry_timestamp_seconds",
        "When the first of the certificates of the agents connected to this server's hub "
        "ends (Unix seconds): its agent is cut off then. No sample with none connected",
        value=earliest.timestamp() if earliest is not None else None,
    )
    yield CounterMetricFamily(
        "llmgw_reconcile_passes",
        "Reconcile passes since this server began leading",
        value=figures.reconcile_passes if figures else 0,
    )
    durations = sorted(figures.recent_pass_durations_s) if figures else []
    # A summary as Prometheus has them: quantiles over a recent window, and ``_sum`` and
    # ``_count`` over every pass, from which rate() gives the mean of any range.
    name = "llmgw_reconcile_pass_duration_seconds"
    recent = Metric(
        name,
        f"Reconcile pass duration: quantiles over the last {PASSES_KEPT} passes, or as many "
        "as have run (1 is the slowest); sum and count over every pass since this server "
        "began leading",
        "summary",
    )
    for q in QUANTILES if durations else ():
        duration = durations[min(len(durations) - 1, int(q * len(durations)))]
        recent.add_sample(name, {"quantile": f"{q:g}"}, duration)
    recent.add_sample(f"{name}_count", {}, figures.reconcile_passes if figures else 0)
    recent.add_sample(f"{name}_sum", {}, figures.reconcile_pass_seconds_total if figures else 0.0)
    yield recent
    demand = GaugeMetricFamily(
        "llmgw_model_demand",
        "Requests in flight on an autoscaled model's replicas plus those queued for it, as "
        "the autoscaler last sampled them (on the leader only)",
        labels=["model"],
    )
    for model, value in sorted(figures.demand.items()) if figures else ():
        demand.add_metric([model], value)
    yield demand
    gateways = GaugeMetricFamily(
        "llmgw_gateways",
        "Gateways as the leader's last reconcile pass read their reports: reporting (a "
        "report younger than 5 s) or silent (older, up to 30 s, and not removed as a clean "
        "stop removes it; while one is, nothing scales down and stopping replicas wait)",
        labels=["state"],
    )
    if figures is not None:
        gateways.add_metric(["reporting"], figures.gateways_reporting)
        gateways.add_metric(["silent"], figures.gateways_silent)
    yield gateways


def event_family(by_type: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(
        "llmgw_events", "Events appended to the log, by type", labels=["type"]
    )
    for event_type, n in sorted(by_type.items()):
        family.add_metric([event_type], n)
    return family


def fold_families(state: ClusterState, running: Mapping[str, NodeReport]) -> Iterator[Metric]:
    yield replica_family(state)
    yield from model_count_families(state)
    nodes = GaugeMetricFamily("llmgw_nodes", "Nodes the log knows, by connection", labels=["state"])
    by_state = Counter(
        "lost" if n.lost else "connected" if n.connected else "disconnected"
        for n in state.nodes.values()
    )
    for name in ("connected", "disconnected", "lost"):
        nodes.add_metric([name], by_state[name])
    yield nodes
    yield gpu_family(state)
    yield held_elsewhere_family(state)
    yield GaugeMetricFamily(
        "llmgw_drains_in_progress",
        "Drains of nodes or replicas not done",
        value=len(drains_in_progress(state)),
    )
    yield from placement_families(state, running)


def gpu_family(state: ClusterState) -> Metric:
    """GPUs by health, so that an alert can fire while any GPU is unhealthy: the count of
    ``gpu_marked_unhealthy`` events only grows, and cannot say how many are unhealthy now."""
    family = GaugeMetricFamily(
        "llmgw_gpus",
        "GPUs of the nodes the log knows, healthy or unhealthy (held as flapping included)",
        labels=["state"],
    )
    by_health = Counter(gpu.healthy for node in state.nodes.values() for gpu in node.gpus)
    family.add_metric(["healthy"], by_health[True])
    family.add_metric(["unhealthy"], by_health[False])
    return family


def held_elsewhere_family(state: ClusterState) -> Metric:
    """Each node's GPUs whose UUID another node holds (``app.domain.gpu_claims``), so that
    an alert can fire on a cloned machine or a node that lies: by node, as many series as
    nodes, never one per UUID a node may list."""
    family = GaugeMetricFamily(
        "llmgw_gpus_held_elsewhere",
        "GPUs a node lists whose UUID another node, connected longer, lists too: they take "
        "no new shard (0 for every other node the log knows)",
        labels=["node"],
    )
    for node_id, count in sorted(held_elsewhere_counts(state.nodes.values()).items()):
        family.add_metric([node_id], count)
    return family


def replica_family(state: ClusterState) -> Metric:
    family = GaugeMetricFamily(
        "llmgw_replicas",
        "Replicas by model and phase, ended ones included",
        labels=["model", "phase"],
    )
    by_model_phase = Counter((r.model, r.phase) for r in state.replicas.values())
    for known in state.models.values():  # ended replicas the fold forgot count too
        by_model_phase.update(
            {(known.name, ReplicaPhase(p)): n for p, n in known.forgotten.items()}
        )
    for model in _shown_models(state):
        for phase in ReplicaPhase:
            family.add_metric([model, phase.value], by_model_phase[(model, phase)])
    return family


def model_count_families(state: ClusterState) -> Iterator[Metric]:
    desired = GaugeMetricFamily(
        "llmgw_model_desired_replicas",
        "Replicas a model should have: as operators set it, or as the autoscaler last did "
        "(0 once removed)",
        labels=["model"],
    )
    serving = GaugeMetricFamily(
        "llmgw_model_serving_replicas", "Replicas of a model serving", labels=["model"]
    )
    serving_by_model = Counter(
        r.model for r in state.replicas.values() if r.phase is ReplicaPhase.SERVING
    )
    for model in _shown_models(state):
        desired.add_metric([model], state.models[model].desired)
        serving.add_metric([model], serving_by_model[model])
    yield desired
    yield serving


def _shown_models(state: ClusterState) -> list[str]:
    """Declared models, and removed ones while a replica of theirs is active."""
    active_models = {r.model for r in state.replicas.values() if r.phase in ACTIVE_PHASES}
    return sorted(
        name for name, m in state.models.items() if not m.removed or name in active_models
    )


def drains_in_progress(state: ClusterState) -> set[str]:
    """Drain ids of draining nodes, and of single replicas still draining."""
    node_drains = {n.drain_id for n in state.nodes.values() if n.drain_id is not None}
    replica_drains = {
        r.drain_id
        for r in state.replicas.values()
        if r.drain_id is not None and r.phase is ReplicaPhase.DRAINING
    }
    return node_drains | replica_drains


def placement_families(
    state: ClusterState, running: Mapping[str, NodeReport] = NOTHING_REPORTED
) -> Iterator[Metric]:
    """The models that cannot place a replica, and why each node is rejected, by what the
    reconciler holds (``Allocations.for_placement``): ``running`` is what each connected
    node reports running."""
    stuck = GaugeMetricFamily(
        "llmgw_models_unplaceable", "Models below their count that no node can take a replica of"
    )
    rejections = GaugeMetricFamily(
        "llmgw_placement_rejections",
        "For each model that cannot place a replica, the nodes rejected for each reason",
        labels=["model", "reason"],
    )
    unplaceable = _unplaceable_models(state)
    allocations = Allocations.for_placement(state, running)
    for name in unplaceable:
        explanation = explain_placement(state, state.models[name].spec, allocations, detail=False)
        counts = Counter(r for c in explanation.candidates for r in c.rejections)
        for reason in Rejection:
            rejections.add_metric([name, reason.value], counts[reason])
    stuck.add_metric([], len(unplaceable))
    yield stuck
    yield rejections


def _unplaceable_models(state: ClusterState) -> list[str]:
    counting = Counter(r.model for r in state.replicas.values() if r.phase in COUNTING_PHASES)
    return sorted(
        name
        for name, model in state.models.items()
        if model.unplaceable_reason is not None and counting[name] < model.desired
    )


@get("/metrics", include_in_schema=False, media_type=MEDIA_TYPE)
async def metrics(cluster_metrics: NamedDependency[ClusterMetrics]) -> Response[bytes]:
    return Response(await cluster_metrics.render(), media_type=MEDIA_TYPE)
