"""The gateway's own Prometheus metrics, in a registry each gateway owns.

Request figures are counted as requests end (one counter, four histograms), in plain
numbers published at each scrape (``app.gateway.request_metrics``): no lock per update.
Per-replica figures (signals, in-flight, staleness), the queues per model and the requests
held for a cold start are read from the router when ``/metrics`` is scraped, not kept up
to date on the request path.

The ``model`` label only ever holds declared models (or ``""``): a client's typo must not
become a new time series. A model's series go with the routing table that no longer
declares it (``keep_models``; the router forgets its own counts of the model then too):
a gateway that runs for months while models come and go publishes the models there are,
not every model it ever served.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.gateway.admission import ReplicaView
from app.gateway.ejection import Ejector
from app.gateway.request_metrics import RequestCollector, RequestCounts, RequestSeries, Series
from app.listeners.refusals import ListenerCollector, ListenerRefusals

DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
)  # fmt: skip
FIRST_BYTE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
QUEUE_BUCKETS = (
    0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
ADDED_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
"""Each reaches an hour: a request held while its model starts from zero waits up to its
cold-start timeout (at most an hour, ``MAX_COLD_START_S``), and that wait counts in all four
(queue, the gateway's share, first byte, duration). Past the last bound a figure is only
known to be longer, so the bounds go that far; no two are more than 5 times apart."""

LISTENER_FAMILIES = "llmgw_gateway_listener"
"""``_refusals`` and ``_idle_closed``, counted by the listeners (``app.listeners.refusals``):
client (the API) and metrics."""

CLIENT_GONE = 499
"""Status recorded for a request whose client disconnected before its answer ended."""


ReplicaReader = Callable[[], Iterable[ReplicaView]]
QueueReader = Callable[[], dict[str, int]]
HoldReader = Callable[[], dict[tuple[str, str], int]]
"""Requests held for a cold start that ended, by (model, outcome)."""


RouteReader = Callable[[], dict[tuple[str, str, str], int]]
"""Requests given a replica, by (model, policy, reason)."""


class _RouteCollector(Collector):
    def __init__(self, read: RouteReader) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily(
            "llmgw_gateway_route_decisions",
            "Requests given a replica, by model, routing policy and reason "
            "(docs/gateway-routing.md).",
            labels=["model", "policy", "reason"],
        )
        for (model, policy, reason), count in sorted(self._read().items()):
            decisions.add_metric([model, policy, reason], count)
        yield decisions


class _ReplicaCollector(Collector):
    def __init__(self, read: ReplicaReader, queued: QueueReader, holds: HoldReader) -> None:
        self._read = read
        self._queued = queued
        self._holds = holds

    def collect(self) -> Iterator[Metric]:
        labels = ["replica", "model"]
        in_flight = _gauge("replica_in_flight", "Requests this gateway has open.", labels)
        reserved = _gauge(
            "replica_reserved", "Requests sent that the engine cannot have counted yet.", labels
        )
        waiting = _gauge("replica_waiting", "The engine's waiting requests.", labels)
        running = _gauge("replica_running", "The engine's running requests.", labels)
        kv_usage = _gauge("replica_kv_usage_ratio", "The engine's KV-cache usage, 0 to 1.", labels)
        age = _gauge("replica_signals_age_seconds", "Age of the last good scrape.", labels)
        stale = _gauge(
            "stale_replicas",
            "Replicas routed by in-flight count alone: no signals yet, or stale ones.",
            [],
        )
        queued = _gauge(
            "queued",
            "Requests waiting for an eligible replica, or held while their model starts from zero.",
            ["model"],
        )
        holds = CounterMetricFamily(
            "llmgw_gateway_cold_start_holds",
            "Requests held while their model started from zero, by how the hold ended: "
            "served, timed_out, cancelled (the client left) or failed.",
            labels=["model", "outcome"],
        )
        stale_count = 0
        for view in self._read():
            values = [view.replica_id, view.model]
            in_flight.add_metric(values, view.in_flight)
            reserved.add_metric(values, view.reserved)
            stale_count += view.stale
            for family, value in (
                (waiting, view.waiting),
                (running, view.running),
                (kv_usage, view.kv_usage),
                (age, view.signals_age_s),
            ):
                if value is not None:
                    family.add_metric(values, value)
        stale.add_metric([], stale_count)
        for model, count in self._queued().items():
            queued.add_metric([model], count)
        for (model, outcome), count in sorted(self._holds().items()):
            holds.add_metric([model, outcome], count)
        yield from (in_flight, reserved, waiting, running, kv_usage, age, stale, queued, holds)


class _EjectionCollector(Collector):
    def __init__(self, ejector: Ejector) -> None:
        self._ejector = ejector

    def collect(self) -> Iterator[Metric]:
        labels = ["replica", "model"]
        ejected = _gauge(
            "replica_ejected",
            "1 while this gateway keeps the replica out of rotation for failing (cooling "
            "off, or waiting for a probe to succeed), else 0.",
            labels,
        )
        ejections = CounterMetricFamily(
            "llmgw_gateway_replica_ejections",
            "Times this gateway ejected the replica for failing requests in a row.",
            labels=labels,
        )
        out = {e.replica_id for e in self._ejector.ejected()}
        for replica_id, model in sorted(self._ejector.routed().items()):
            ejected.add_metric([replica_id, model], 1 if replica_id in out else 0)
        for (replica_id, model), count in sorted(self._ejector.ejections_total().items()):
            ejections.add_metric([replica_id, model], count)
        yield from (ejected, ejections)


class RoutingReadCounts(msgspec.Struct, frozen=True):
    """A gateway's reads of the routing table so far (``app.gateway.source``)."""

    reads: int
    whole: int
    """Of them, those of every route."""
    taking_s: float
    """Seconds of the event loop taking in what they read."""


RoutingReadReader = Callable[[], RoutingReadCounts]


class _RoutingReadCollector(Collector):
    def __init__(self, read: RoutingReadReader) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        reads = CounterMetricFamily(
            "llmgw_gateway_routing_reads",
            "Reads of the routing table from the database, by what they read: every route "
            "(whole: the first on a connection, then every 30 s) or the routes changed since "
            "the last read (changes).",
            labels=["read"],
        )
        counts = self._read()
        reads.add_metric(["whole"], counts.whole)
        reads.add_metric(["changes"], counts.reads - counts.whole)
        taking = CounterMetricFamily(
            "llmgw_gateway_routing_take_seconds",
            "Seconds of the gateway's event loop spent building each routing snapshot read "
            "and handing it to the router; under steady change at most a tenth of the loop.",
        )
        taking.add_metric([], counts.taking_s)
        yield from (reads, taking)


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"llmgw_gateway_{name}", documentation, labels=labels)


def _by_reason(registry: CollectorRegistry, name: str, documentation: str) -> Counter:
    return Counter(name, documentation, ["reason"], registry=registry)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        registry = self.registry
        self._requests = RequestCounts(
            RequestSeries(
                (
                    "llmgw_gateway_requests",
                    "Completion requests answered, by model and HTTP status (a status the "
                    "gateway does not answer itself is counted under its class, 2xx to 5xx).",
                ),
                duration=Series(
                    "llmgw_gateway_request_duration_seconds",
                    "From the request's arrival to the end of its answer.",
                    DURATION_BUCKETS,
                ),
                first_byte=Series(
                    "llmgw_gateway_time_to_first_byte_seconds",
                    "From the request's arrival to the first byte of the engine's answer.",
                    FIRST_BYTE_BUCKETS,
                ),
                queue=Series(
                    "llmgw_gateway_queue_seconds",
                    "Time waiting for an eligible replica (admission).",
                    QUEUE_BUCKETS,
                ),
                added=Series(
                    "llmgw_gateway_added_seconds",
                    "Time the gateway itself added to a request (all but the engine's time).",
                    ADDED_BUCKETS,
                ),
            )
        )
        registry.register(RequestCollector(self._requests))
        self._rejections = _by_reason(
            registry,
            "llmgw_gateway_admission_rejections",
            "Requests refused before reaching an engine, by reason.",
        )
        self._retries = _by_reason(
            registry,
            "llmgw_gateway_upstream_retries",
            "Requests sent again to another replica, by what went wrong with the first.",
        )
        self._egress_refusals = _by_reason(
            registry,
            "llmgw_gateway_engine_egress_refusals",
            "Routes left out of routing because their engine address may not be contacted "
            "(see --engine-networks), by reason; each route counted once, when first refused.",
        )
        self._egress_refused_routes = Gauge(
            "llmgw_gateway_egress_refused_routes",
            "Routes of the current routing table left out by the egress check.",
            registry=self.registry,
        )
        self._usage_unusable = Counter(
            "llmgw_gateway_engine_usage_unusable",
            "Answers whose usage had a token figure that is not a whole number from 0 to "
            "1e9, ignored (docs/gateway.md, What an engine may send), by model.",
            ["model"],
            registry=registry,
        )
        self._unusable_models: set[str] = set()
        """The models ``_usage_unusable`` has a series of."""
        self._engine_timeouts = Counter(
            "llmgw_gateway_engine_timeouts",
            "Engine answers cut off because the engine sent nothing within a bound, by "
            "bound: head (no answer head, or no first piece of its body, within "
            "--engine-head-timeout), idle (silent mid-answer past --engine-idle-timeout).",
            ["bound"],
            registry=registry,
        )
        self._streams_cut = Counter(
            "llmgw_gateway_streams_cut",
            "Streams cut off before their end after their 200 head went out (their client "
            "got an error event and [DONE]), by model and reason: broken (the engine's "
            "connection ended or broke mid-stream: it died, or was killed), timeout (it was "
            "silent past its bound), invalid_answer (it sent what the gateway does not "
            "relay), gateway_stopping (still open when the gateway's shutdown grace ran out).",
            ["model", "reason"],
            registry=registry,
        )
        self._id_shared_reports = Counter(
            "llmgw_gateway_id_shared_reports",
            "Reports written while another live gateway process reports under this one's "
            "id (--gateway-id, serve's --server-id): both are counted, each under a key of "
            "its own, but the id names two processes. Give each its own id.",
            registry=registry,
        )
        self._rate_limits_degraded = Gauge(
            "llmgw_gateway_rate_limits_degraded",
            "1 while keys' rate limits are enforced on this gateway's local share because "
            "the database does not answer; 0 while they are shared.",
            registry=self.registry,
        )

    def keep_models(self, declared: Collection[str]) -> None:
        """Drop the series of every model but ``declared`` (and ``""``): those removed."""
        self._requests.keep_models(declared)
        for model in [m for m in self._unusable_models if m not in declared]:
            self._usage_unusable.remove(model)
            self._unusable_models.discard(model)

    def id_shared(self) -> None:
        """A report found another live gateway process reporting under this one's id."""
        self._id_shared_reports.inc()

    def watch_replicas(
        self, read: ReplicaReader, queued: QueueReader, holds: HoldReader = dict
    ) -> None:
        """Publish the router's per-replica figures, its queues and its cold-start holds,
        read at each scrape."""
        self.registry.register(_ReplicaCollector(read, queued, holds))

    def watch_routes(self, read: RouteReader) -> None:
        """Publish the router's routing decisions by model, policy and reason, read at each
        scrape."""
        self.registry.register(_RouteCollector(read))

    def watch_listener_refusals(self, listeners: Sequence[ListenerRefusals]) -> None:
        """Publish what each of the gateway's listeners (labelled by its name) refused
        itself before any request reached the app, and the silent connections it closed,
        read at each scrape."""
        self.registry.register(ListenerCollector(LISTENER_FAMILIES, listeners))

    def watch_routing_reads(self, read: RoutingReadReader) -> None:
        """Publish the routing table's reads from the database and what taking them in cost
        the event loop, read at each scrape."""
        self.registry.register(_RoutingReadCollector(read))

    def watch_ejections(self, ejector: Ejector) -> None:
        """Publish which replicas the router's ejector keeps out, and its ejections."""
        self.registry.register(_EjectionCollector(ejector))

    def answered(
        self,
        model: str,
        status: int,
        *,
        duration_s: float,
        added_s: float,
        first_byte_s: float | None,
        queue_s: float | None,
    ) -> None:
        requests = self._requests
        requests.count(model, status)
        histograms = requests.of_model(model)
        histograms.duration.observe(duration_s)
        histograms.added.observe(added_s)
        if first_byte_s is not None:
            histograms.first_byte.observe(first_byte_s)
        if queue_s is not None:
            histograms.queue.observe(queue_s)

    def rejected(self, reason: str) -> None:
        self._rejections.labels(reason).inc()

    def retried(self, reason: str) -> None:
        self._retries.labels(reason).inc()

    def usage_unusable(self, model: str) -> None:
        self._usage_unusable.labels(model).inc()
        self._unusable_models.add(model)

    def engine_timed_out(self, bound: str) -> None:
        self._engine_timeouts.labels(bound).inc()

    def stream_cut(self, model: str, reason: str) -> None:
        self._streams_cut.labels(model, reason).inc()

    def egress_refused(self, reason: str) -> None:
        self._egress_refusals.labels(reason).inc()

    def rate_limits_degraded(self, degraded: bool) -> None:
        self._rate_limits_degraded.set(1 if degraded else 0)

    def egress_refused_routes(self, count: int) -> None:
        self._egress_refused_routes.set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
