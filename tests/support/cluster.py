"""A whole llmgw cluster of real processes for end-to-end tests: ``llmgw-server serve``
processes sharing one database, ``llmgw-agent`` processes with fake GPUs that dial every
server (so they fail over), the engines those agents start, and standalone
``llmgw-server gateway`` processes in front of them. Servers and gateways connect as the
runtime role, as in production; the cluster reads the log as the owner.

The processes are started, stopped and reaped by ``devcluster``'s orchestrator, the one
``llmgw-dev`` runs on, and certificates come from the ``llmgw-cli cert`` commands an
operator runs (``issue_pki``, once per module). A ``Cluster`` knows which server leads,
kills and restarts servers and agents, calls the admin API with a token, and reads the
event log. Every process writes to a log file; when a test fails those logs are added to
its reports (``add_cluster_logs_to_failed_reports``), and every process, engines included, is
killed when the cluster closes, passed or failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType

import asyncpg
import httpx
import msgspec
import pytest
import pytest_asyncio

from app.domain.model_spec import ModelSpec
from app.store.database import driver_url
from devcluster import pki as devpki
from devcluster.orchestrator import GatewayProcess, Processes, ServerProcess
from devcluster.pki import ClusterPki
from devcluster.ports import NodePortRanges, listens
from devcluster.processes import program
from devcluster.programs import (
    LOOPBACK_ENGINES,
    EnginesOnExit,
    GatewayCommand,
    ServeCommand,
    simulator_command,
)
from devcluster.readiness import answers
from tests.support.databases import runtime_url
from tests.support.fleet import AgentProcess, FleetProcesses
from tests.support.ports import free_port
from tests.support.reports import add_logs_to_failed_reports
from tests.support.waiting import wait_until

__all__ = ["ClusterPki", "GatewayProcess", "ServerProcess"]

SERVER = program("llmgw-server")
CLI = program("llmgw-cli")
ADMIN_TOKEN_NAME = "alice"
ADMIN_TOKEN = "e2e-admin-token-0123456789"
START_WITHIN_S = 20.0
STOP_WAIT_S = 10.0
SIMULATOR_COMMAND = simulator_command("--instant")
JsonObject = dict[str, object]
ENGINE_NETWORKS = LOOPBACK_ENGINES
"""Where the servers and gateways may contact engines: every engine here is on loopback."""


@dataclass(frozen=True)
class ServerSettings:
    """``llmgw-server serve`` timings, short enough for tests. The adoption grace is longer
    than the others: after a control plane restarts, an agent may be up to about 8 s into
    its reconnect backoff (0.5 s doubling), and a grace that ends before every agent is back
    starts the lost timeout of nodes that are merely slow. It ends as soon as every known
    node has said hello, so it costs nothing when they are quick."""

    adoption_grace_s: float = 10.0
    lost_timeout_s: float = 5.0
    stability_window_s: float = 1.0
    heartbeat_interval_s: float = 0.5
    reconcile_interval_s: float = 0.2
    extra_flags: tuple[str, ...] = ()
    """Any other ``serve`` flags, as given."""

    def flags(self) -> list[str]:
        return [
            *("--adoption-grace", str(self.adoption_grace_s)),
            *("--lost-timeout", str(self.lost_timeout_s)),
            *("--stability-window", str(self.stability_window_s)),
            *("--heartbeat-interval", str(self.heartbeat_interval_s)),
            *("--reconcile-interval", str(self.reconcile_interval_s)),
            *self.extra_flags,
        ]


def issue_pki(directory: Path, nodes: Iterable[str] = ()) -> ClusterPki:
    """Create the CA and the server certificate for 127.0.0.1 as the docs say, and the
    certificates of ``nodes`` now rather than when their agents first start."""
    return devpki.issue_pki(directory, ca_name="llmgw CA e2e", nodes=nodes)


@dataclass(frozen=True)
class Exit:
    """A server that failed (or was killed) and was restarted by ``Cluster.supervised``."""

    server_id: str
    returncode: int | None


@dataclass(frozen=True)
class LoggedEvent:
    """An event as the ``events`` table holds it."""

    position: int
    stream: str
    type: str
    data: JsonObject
    actor: str
    correlation_id: str | None
    epoch: int | None
    recorded_at: datetime

    def get(self, key: str) -> object:
        return self.data.get(key)


def about(**data: object) -> Callable[[LoggedEvent], bool]:
    """Matches events whose data holds every one of ``data``'s items."""
    return lambda event: all(event.data.get(key) == value for key, value in data.items())


def first(log: Iterable[LoggedEvent], event_type: str, **data: object) -> LoggedEvent:
    """The first ``event_type`` event in ``log`` whose data holds ``data``; fails without."""
    matches = about(**data)
    for event in log:
        if event.type == event_type and matches(event):
            return event
    raise AssertionError(f"no {event_type} with {data} in the log")


def node_of(replica: JsonObject) -> str:
    """The one node a replica of one shard (as ``GET /admin/v1/replicas`` shows it) runs on."""
    nodes = replica["nodes"]
    assert isinstance(nodes, list), replica
    assert len(nodes) == 1, replica
    return str(nodes[0])


@dataclass(frozen=True)
class Leadership:
    epoch: int
    holder: str


@dataclass(eq=False)
class Cluster:
    """Servers and agents of one test, on one database. Use ``async with``."""

    database_url: str
    directory: Path
    pki: ClusterPki
    settings: ServerSettings = field(default_factory=ServerSettings)
    agent_reconnect_max_delay_s: float | None = None
    """Agents' ``--reconnect-max-delay``: short for a test that restarts the control plane
    more often than every 10 s, which would otherwise find them ever slower to come back."""
    servers: list[ServerProcess] = field(default_factory=list)
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    gateways: list[GatewayProcess] = field(default_factory=list)
    engine_ports: NodePortRanges = field(default_factory=NodePortRanges)
    _processes: Processes | None = None
    _fleet: FleetProcesses | None = None
    _database: asyncpg.Connection | None = None
    _http: httpx.AsyncClient | None = None
    _supervised: bool = False

    async def __aenter__(self) -> Cluster:
        self._processes = Processes(self.directory)
        self._fleet = FleetProcesses(self.directory, self._processes)
        self._database = await asyncpg.connect(driver_url(self.database_url))
        self._http = httpx.AsyncClient(
            headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10.0
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Kill every server, agent and engine; engines are found through the agents' state
        directories and every pid the log recorded for a shard."""
        for child in (*self.gateways, *self.servers):
            child.kill()
        engine_pids: list[int] = []
        if self._database is not None:
            # The database may be gone (a test that stops it failed): engines are then
            # found through the agents' state directories alone.
            with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                engine_pids = [
                    pid for e in await self.events() if isinstance(pid := e.get("pid"), int)
                ]
            with contextlib.suppress(asyncpg.InterfaceError, OSError):
                await self._database.close(timeout=STOP_WAIT_S)
        if self._processes is not None:
            await asyncio.to_thread(self._processes.reap, engine_pids)
        if self._http is not None:
            await self._http.aclose()

    # -- processes --------------------------------------------------------------------

    def start_server(self) -> ServerProcess:
        """A new server with ports of its own; it leads or stands by."""
        index = len(self.servers)
        server = self._spawn_server(f"server-{index}", free_port(), free_port(), free_port())
        self.servers.append(server)
        return server

    def restart_server(self, server: ServerProcess) -> ServerProcess:
        """Start ``server`` again on the same ports, after it was killed or stopped."""
        if not server.exited():
            raise AssertionError(f"{server.server_id} still runs; kill or stop it first")
        again = self._spawn_server(
            server.server_id, server.admin_port, server.agent_port, server.client_port
        )
        self.servers[self.servers.index(server)] = again
        return again

    @contextlib.asynccontextmanager
    async def supervised(self, *, restart_after_s: float = 1.0) -> AsyncIterator[list[Exit]]:
        """Restart every server that fails while this is open (exits with a non-zero code
        or is killed), ``restart_after_s`` later, as the documented systemd unit does
        (``Restart=on-failure``): a deposed server exits with 3 and comes back as a
        standby. Yields the exits seen so far."""
        exits: list[Exit] = []
        loop = asyncio.get_running_loop()

        async def watch() -> None:
            exited_at: dict[str, float] = {}
            while True:
                for server in list(self.servers):
                    if not server.exited() or server.process.returncode == 0:
                        continue
                    since = exited_at.setdefault(server.server_id, loop.time())
                    if loop.time() - since >= restart_after_s:
                        exits.append(Exit(server.server_id, server.process.returncode))
                        self.restart_server(server)
                        del exited_at[server.server_id]
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch())
        self._supervised = True
        try:
            yield exits
        finally:
            self._supervised = False
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    def _spawn_server(
        self, server_id: str, admin_port: int, agent_port: int, client_port: int
    ) -> ServerProcess:
        command = ServeCommand(
            pki=self.pki,
            server_id=server_id,
            admin_port=admin_port,
            agent_port=agent_port,
            client_port=client_port,
            database_url=runtime_url(self.database_url),
            admin_tokens=((ADMIN_TOKEN_NAME, ADMIN_TOKEN),),
            engine_networks=ENGINE_NETWORKS,
            flags=tuple(self.settings.flags()),
        )
        return self._orchestrator().start_server(server_id, command)

    async def start_gateway(
        self, *, refresh_interval_s: float = 1.0, queue_timeout_s: float = 5.0
    ) -> GatewayProcess:
        """A standalone ``llmgw-server gateway`` on a free port, once ``/readyz`` says it
        has read the routing table. Changes reach it by NOTIFY; the refresh interval only
        bounds how long a missed one can go unnoticed."""
        command = GatewayCommand(
            gateway_id=f"gateway-{len(self.gateways)}",
            port=free_port(),
            database_url=runtime_url(self.database_url),
            refresh_interval_s=refresh_interval_s,
            queue_timeout_s=queue_timeout_s,
            engine_networks=ENGINE_NETWORKS,
        )
        gateway = self._orchestrator().start_gateway(command.gateway_id, command)
        self.gateways.append(gateway)
        await self.wait_until_gateway_ready(gateway)
        return gateway

    async def wait_until_gateway_ready(
        self, gateway: GatewayProcess, *, within_s: float = START_WITHIN_S
    ) -> None:
        async def ready() -> bool:
            if gateway.exited():
                raise AssertionError(f"{gateway.gateway_id} exited; see its log")
            return await asyncio.to_thread(answers, gateway.readyz_url)

        await wait_until(ready, within_s=within_s, every_s=0.05, what=f"{gateway.gateway_id} ready")

    async def start_fleet(
        self,
        nodes: Sequence[str],
        model: str,
        *,
        replicas: int,
        command: str = SIMULATOR_COMMAND,
    ) -> list[JsonObject]:
        """An agent for each of ``nodes``, and ``model`` applied with ``command`` (the
        instant engine simulator unless told); once ``replicas`` of it serve, those
        replicas, by id."""
        for node in nodes:
            self.start_agent(node)
        await self.wait_for_nodes_connected(nodes)
        await self.apply_simulated_model(model, replicas=replicas, command=command)
        return await self.wait_for_serving(model, replicas)

    def start_agent(
        self, node_id: str, *, fake_gpus: str = "2x80GB", engines_on_exit: EnginesOnExit = "keep"
    ) -> AgentProcess:
        """``llmgw-agent`` for ``node_id`` dialling every server started so far, in order."""
        if not self.servers:
            raise AssertionError("start a server before its agents")
        first, *others = [server.agent_uri for server in self.servers]
        agent = self.fleet.start_agent(
            first,
            node_id,
            self.pki.node(node_id),
            self.directory / f"state-{node_id}",
            fake_gpus=fake_gpus,
            fallback_servers=others,
            port_range=self.engine_ports.of(node_id),
            reconnect_max_delay_s=self.agent_reconnect_max_delay_s,
            engines_on_exit=engines_on_exit,
        )
        self.agents[node_id] = agent
        return agent

    def stop_agent(self, node_id: str) -> int:
        """SIGTERM the node's agent, as its supervisor stops it; the exit code."""
        agent = self.agents[node_id]
        agent.send(signal.SIGTERM)
        return agent.process.wait(timeout=STOP_WAIT_S)

    def restart_agent(self, node_id: str) -> AgentProcess:
        """Kill the node's agent (its engines live on) and start it again."""
        self.agents[node_id].kill()
        return self.start_agent(node_id)

    @property
    def fleet(self) -> FleetProcesses:
        """For agents the cluster does not track by node (one holding another node's
        certificate, say); they are reaped with the others."""
        if self._fleet is None:
            raise AssertionError("use the cluster inside `async with`")
        return self._fleet

    def _orchestrator(self) -> Processes:
        if self._processes is None:
            raise AssertionError("use the cluster inside `async with`")
        return self._processes

    def logs(self) -> str:
        """Every process's log, servers first, each under a heading."""
        paths = [
            path
            for pattern in ("server-*.log", "gateway-*.log", "agent-*.log")
            for path in sorted(self.directory.glob(pattern))
        ]
        return "\n".join(
            f"===== {path.name} =====\n{path.read_text(errors='replace')}" for path in paths
        )

    # -- leadership -------------------------------------------------------------------

    async def leadership(self) -> Leadership | None:
        row = await self._db().fetchrow("SELECT epoch, holder FROM leadership WHERE id = 1")
        return None if row is None else Leadership(epoch=row["epoch"], holder=row["holder"])

    async def wait_for_leader(
        self, *, after_epoch: int = 0, within_s: float = START_WITHIN_S
    ) -> ServerProcess:
        """The server that leads with an epoch newer than ``after_epoch``, once its agent
        hub accepts connections."""
        found: list[ServerProcess] = []

        async def leads() -> bool:
            if not self._supervised and all(server.exited() for server in self.servers):
                raise AssertionError("every server exited")
            leadership = await self.leadership()
            if leadership is None or leadership.epoch <= after_epoch:
                return False
            found[:] = [s for s in self.servers if s.server_id == leadership.holder]
            return bool(found) and not found[0].exited() and listens(found[0].agent_port)

        await wait_until(leads, within_s=within_s, every_s=0.05, what="a leader")
        return found[0]

    async def wait_until_serving_admin(self, server: ServerProcess) -> None:
        async def answers() -> bool:
            with contextlib.suppress(httpx.TransportError):
                response = await self._client().get(f"{server.admin_url}/admin/v1/nodes")
                return response.status_code == 200
            return False

        await wait_until(
            answers, within_s=START_WITHIN_S, every_s=0.05, what=f"{server.server_id} admin API"
        )

    # -- admin API --------------------------------------------------------------------

    async def apply_simulated_model(
        self, name: str, *, replicas: int, via: ServerProcess | None = None, **spec: object
    ) -> JsonObject:
        """``PUT /admin/v1/models/{name}`` with the instant engine simulator as command."""
        body = {"command": SIMULATOR_COMMAND, "replicas": replicas, **spec}
        return await self._admin("PUT", f"/admin/v1/models/{name}", via, body=body)

    async def apply_model(self, spec: ModelSpec, *, via: ServerProcess | None = None) -> bool:
        """``PUT /admin/v1/models/{name}`` with ``spec`` whole, every field written out, as
        ``llmgw-cli models apply`` sends a spec file; whether anything was recorded."""
        body = msgspec.to_builtins(spec)
        answer = await self._admin("PUT", f"/admin/v1/models/{spec.name}", via, body=body)
        changed = answer["changed"]
        assert isinstance(changed, bool), answer
        return changed

    async def drain_node(
        self, node_id: str, *, grace_s: float = 600.0, via: ServerProcess | None = None
    ) -> str:
        """``POST /admin/v1/nodes/{id}/drain``; the drain id."""
        answer = await self._admin(
            "POST", f"/admin/v1/nodes/{node_id}/drain", via, body={"grace_s": grace_s}
        )
        drain_id = answer["drain_id"]
        assert isinstance(drain_id, str)
        return drain_id

    async def replicas(
        self, *, via: ServerProcess | None = None, **filters: str
    ) -> list[JsonObject]:
        """``GET /admin/v1/replicas`` with ``model``, ``node`` or ``phase`` filters."""
        return await self._admin_list("/admin/v1/replicas", via, filters)

    async def nodes(self, *, via: ServerProcess | None = None) -> list[JsonObject]:
        return await self._admin_list("/admin/v1/nodes", via)

    async def wait_for_nodes_connected(
        self, node_ids: Iterable[str], *, within_s: float = START_WITHIN_S
    ) -> None:
        """Until the admin API shows every one of ``node_ids`` connected."""
        wanted = set(node_ids)

        async def connected() -> bool:
            nodes = await self.nodes()
            return wanted <= {str(n["id"]) for n in nodes if n["connected"]}

        await wait_until(connected, within_s=within_s, every_s=0.1, what=f"{wanted} connected")

    async def create_key(
        self,
        name: str,
        models: Iterable[str] = ("*",),
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        via: ServerProcess | None = None,
    ) -> str:
        """``POST /admin/v1/keys``: a new API key, whole, as clients send it."""
        body = {"name": name, "models": list(models), "rpm": rpm, "tpm": tpm}
        answer = await self._admin("POST", "/admin/v1/keys", via, body=body)
        key = answer["key"]
        assert isinstance(key, str), answer
        return key

    async def scale(
        self, model: str, replicas: int, *, via: ServerProcess | None = None
    ) -> JsonObject:
        """``POST /admin/v1/models/{model}/scale``."""
        return await self._admin(
            "POST", f"/admin/v1/models/{model}/scale", via, body={"replicas": replicas}
        )

    async def wait_for_serving(
        self, model: str, count: int, *, within_s: float = 20.0
    ) -> list[JsonObject]:
        """Until exactly ``count`` replicas of ``model`` serve; those replicas, by id."""
        serving: list[JsonObject] = []

        async def that_many() -> bool:
            serving[:] = await self.replicas(model=model, phase="serving")
            return len(serving) == count

        await wait_until(
            that_many, within_s=within_s, every_s=0.1, what=f"{count} {model} replicas serving"
        )
        return sorted(serving, key=lambda replica: str(replica["id"]))

    async def drain(self, drain_id: str, *, via: ServerProcess | None = None) -> JsonObject:
        return await self._admin("GET", f"/admin/v1/drains/{drain_id}", via)

    async def admin(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        params: Mapping[str, str] | None = None,
        via: ServerProcess | None = None,
    ) -> object:
        """Any admin API call with the operator's token, to ``via`` or the first server
        that runs; the decoded answer (None for an empty one: ``204 No Content``). An error
        status fails the test with its problem document."""
        server = via or next((s for s in self.servers if not s.exited()), None)
        if server is None:
            raise AssertionError("no server runs to ask")
        response = await self._client().request(
            method, f"{server.admin_url}{path}", json=body, params=params
        )
        if response.status_code >= 400:
            raise AssertionError(f"{method} {path}: {response.status_code} {response.text}")
        if not response.content:
            return None
        answer: object = response.json()
        return answer

    async def _admin(
        self, method: str, path: str, via: ServerProcess | None, *, body: object = None
    ) -> JsonObject:
        answer = await self.admin(method, path, body=body, via=via)
        assert isinstance(answer, dict), answer
        return answer

    async def _admin_list(
        self, path: str, via: ServerProcess | None, params: Mapping[str, str] | None = None
    ) -> list[JsonObject]:
        answer = await self.admin("GET", path, params=params, via=via)
        assert isinstance(answer, list), answer
        return answer

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            raise AssertionError("use the cluster inside `async with`")
        return self._http

    # -- the event log ----------------------------------------------------------------

    async def events(self, *types: str, after: int = 0) -> list[LoggedEvent]:
        """The log in order, only ``types`` when given, only after position ``after``."""
        rows = await self._db().fetch(
            "SELECT position, stream, type, data, actor, correlation_id, recorded_at, "
            "meta->>'epoch' AS epoch "
            "FROM events WHERE position > $1 AND (cardinality($2::text[]) = 0 "
            "OR type = ANY($2::text[])) ORDER BY position",
            after,
            list(types),
        )
        return [
            LoggedEvent(
                position=row["position"],
                stream=row["stream"],
                type=row["type"],
                data=json.loads(row["data"]),
                actor=row["actor"],
                correlation_id=row["correlation_id"],
                epoch=None if row["epoch"] is None else int(row["epoch"]),
                recorded_at=row["recorded_at"],
            )
            for row in rows
        ]

    async def last_position(self) -> int:
        position = await self._db().fetchval("SELECT coalesce(max(position), 0) FROM events")
        assert isinstance(position, int)
        return position

    async def wait_for_event(
        self,
        event_types: str | tuple[str, ...],
        matches: Callable[[LoggedEvent], bool] = lambda _: True,
        *,
        after: int = 0,
        within_s: float = 15.0,
    ) -> LoggedEvent:
        """The first event of ``event_types`` after ``after`` that ``matches``, once one is
        logged."""
        types = (event_types,) if isinstance(event_types, str) else event_types
        found: list[LoggedEvent] = []

        async def logged() -> bool:
            found[:] = [e for e in await self.events(*types, after=after) if matches(e)]
            return bool(found)

        await wait_until(logged, within_s=within_s, every_s=0.1, what=f"a {types} event")
        return found[0]

    async def reconnect_database(self) -> None:
        """A new connection for reading the log, after the database was restarted."""
        if self._database is not None:
            with contextlib.suppress(asyncpg.InterfaceError, OSError):
                await self._database.close(timeout=STOP_WAIT_S)
        self._database = await asyncpg.connect(driver_url(self.database_url))

    def _db(self) -> asyncpg.Connection:
        if self._database is None:
            raise AssertionError("use the cluster inside `async with`")
        return self._database

    # -- maintenance commands ---------------------------------------------------------

    async def cli(
        self, *args: str, via: ServerProcess | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``llmgw-cli ARGS`` as the operator runs it, against ``via`` or the first server
        that runs, with the operator's token and no other llmgw setting."""
        server = via or next((s for s in self.servers if not s.exited()), None)
        if server is None:
            raise AssertionError("no server runs to ask")
        environment = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("LLMGW_") and key != "XDG_CONFIG_HOME"
        } | {"LLMGW_ADMIN_URL": server.admin_url, "LLMGW_ADMIN_TOKEN": ADMIN_TOKEN}
        return await asyncio.to_thread(
            subprocess.run,
            [CLI, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=environment,
        )

    async def verify_projections(self) -> subprocess.CompletedProcess[str]:
        """``llmgw-server projections rebuild --verify`` against the cluster's database."""
        return await asyncio.to_thread(
            subprocess.run,
            [SERVER, "projections", "rebuild", "--verify", "--database-url", self.database_url],
            capture_output=True,
            text=True,
            timeout=60,
        )


@contextlib.asynccontextmanager
async def reported_cluster(
    database_url: str, directory: Path, pki: ClusterPki, request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    """A ``Cluster`` whose process logs join the reports of ``request``'s test if it fails,
    and which is reaped, passed or failed."""
    async with Cluster(database_url, directory, pki) as cluster:
        add_cluster_logs_to_failed_reports(request, cluster)
        yield cluster


@pytest_asyncio.fixture(loop_scope="session")
async def cluster(
    database_url: str, tmp_path: Path, pki: ClusterPki, request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    """The test's cluster on its own database; the ``pki`` fixture says whose certificates."""
    async with reported_cluster(database_url, tmp_path, pki, request) as cluster:
        yield cluster


def add_cluster_logs_to_failed_reports(request: pytest.FixtureRequest, cluster: Cluster) -> None:
    """Add the cluster's process logs, as they are then, to every failed report of
    ``request``'s test."""
    add_logs_to_failed_reports(request.node, "cluster process logs", cluster.logs)
