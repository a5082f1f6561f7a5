"""The admin REST API (Litestar), served on the admin listener only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from litestar import Litestar, Request
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from app.admin.auth import TokenAuthenticator
from app.admin.autoscale import AutoscaleController
from app.admin.bodies import MAX_BODY_BYTES
from app.admin.certificates import CertificateController
from app.admin.closed_bodies import ClosedBodies
from app.admin.drains import DrainController
from app.admin.errors import EXCEPTION_HANDLERS
from app.admin.events import EventsController
from app.admin.health import Readiness, healthz, readyz
from app.admin.history import HistoryController
from app.admin.idempotency_header import idempotency_of
from app.admin.keys import KeyController
from app.admin.metrics import ClusterMetrics, GatewayPage, LiveSource, metrics
from app.admin.middleware import (
    ACTOR_KEY,
    MIDDLEWARE,
    REQUEST_ID_KEY,
    put_in_front_of_router,
    request_id_of,
)
from app.admin.models import ModelController
from app.admin.nodes import NodeController
from app.admin.operation_schema import declare_in_schema
from app.admin.placement import PlacementController
from app.admin.replicas import ReplicaController
from app.admin.rollouts import RolloutController
from app.admin.schema_page import SCHEMA_PATH, schema_pages
from app.admin.traffic import TrafficSource
from app.admin.tuning import TuningController
from app.listeners.refusals import ListenerRefusals
from app.pki.ends import CertificateEnd
from app.services.operations import Caller, Operations, RunningSource, nothing_running
from app.store.gateway_reports import TrafficReports
from app.store.postgres import PostgresEventStore


async def provide_caller(request: Request[Any, Any, Any]) -> Caller:
    """The actor the ``require_actor`` guard found, the request's id (the client's
    ``X-Request-Id`` when it sent a usable one) and its ``Idempotency-Key``, if any."""
    state = request.scope["state"]
    request_id = state.get(REQUEST_ID_KEY) or request_id_of(request.scope)
    idempotency = await idempotency_of(request)
    return Caller(actor=state[ACTOR_KEY], request_id=request_id, idempotency=idempotency)


def create_admin_app(
    store: PostgresEventStore,
    authenticator: TokenAuthenticator,
    readiness: Readiness | None = None,
    live: LiveSource | None = None,
    gateway_metrics: GatewayPage | None = None,
    traffic: TrafficSource | None = None,
    running: RunningSource = nothing_running,
    certificates: Sequence[CertificateEnd] = (),
    listener_refusals: ListenerRefusals | None = None,
) -> Litestar:
    """The admin API over ``store``. ``readiness`` defaults to checking the store's database
    with no control plane role to report; ``live`` gives ``/metrics`` the leader's figures,
    ``gateway_metrics`` those of the gateway in this process; ``traffic`` (by default the
    gateways' reports in the store's database) what gateways measured of replicas;
    ``running`` what each connected node reports running, which placement's explanations
    and a drain's room hold as the reconciler does; ``certificates`` when those the server
    presents and trusts end, and ``listener_refusals`` what the admin listener refused
    itself (``admin_protocol``), for ``/metrics``."""
    operations = Operations(store, running=running)
    checks = readiness or Readiness(store.engine)
    cluster_metrics = ClusterMetrics(
        store, live, gateway_metrics, running, certificates, listener_refusals
    )
    replica_traffic = traffic or TrafficReports(store.engine)

    async def provide_store() -> PostgresEventStore:
        return store

    async def provide_operations() -> Operations:
        return operations

    async def provide_readiness() -> Readiness:
        return checks

    async def provide_metrics() -> ClusterMetrics:
        return cluster_metrics

    async def provide_traffic() -> TrafficSource:
        return replica_traffic

    app = Litestar(
        route_handlers=[
            AutoscaleController,
            CertificateController,
            EventsController,
            HistoryController,
            KeyController,
            ModelController,
            PlacementController,
            NodeController,
            DrainController,
            ReplicaController,
            RolloutController,
            TuningController,
            healthz,
            readyz,
            metrics,
        ],
        dependencies={
            "store": Provide(provide_store),
            "operations": Provide(provide_operations),
            "readiness": Provide(provide_readiness),
            "cluster_metrics": Provide(provide_metrics),
            "traffic": Provide(provide_traffic),
            "caller": Provide(provide_caller),
        },
        state=State({"authenticator": authenticator}),
        exception_handlers=EXCEPTION_HANDLERS,
        openapi_config=OpenAPIConfig(
            title="llmgw admin API", version="1", path=SCHEMA_PATH, render_plugins=schema_pages()
        ),
        plugins=[ClosedBodies()],
        # Outermost first; the request log is in front of the router (put_in_front_of_router).
        middleware=list(MIDDLEWARE),
        # The process's logging is app.logs's: Litestar's own would replace the root
        # handler with a plain-text one of its own at startup.
        logging_config=None,
        request_max_body_size=MAX_BODY_BYTES,
        debug=False,
    )
    declare_in_schema(app)
    put_in_front_of_router(app)
    return app
