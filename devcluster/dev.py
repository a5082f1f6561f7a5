"""``llmgw-dev``: a whole local cluster of real processes, in one command.

PostgreSQL (``devcluster.database``), a CA with its certificates (``llmgw-cli cert``), an
admin token, ``llmgw-server serve`` with its gateway, two ``llmgw-agent`` processes with
fake GPUs, a ``demo`` model whose engines are the simulator or llama.cpp with a real model
(``devcluster.demo_model``), and an API key for it.
Everything lives in one state directory and is reused by the next run: the log survives,
certificates, token and API key stay the same (a key revoked meanwhile is replaced).

Engine ports. Each state directory has a block of engine ports of its own
(``devcluster.ports``), so several dev clusters, each with its own ``--state-dir`` and
listener ports, run side by side on one machine without their engines meeting.

Stopping. Ctrl-C or SIGTERM stops the agents first. They run with ``--engines-on-exit
stop``: each stops its engines, reports every stop to the control plane (``agent shutting
down``) and only then disconnects, so the log records the replicas as stopped by their
agents, not lost. Then ``llmgw-agent stop-engines`` stops whatever an agent left behind,
then the server stops, then the local PostgreSQL. The next run's agents report no shards;
the control plane restarts those same replicas where they were placed (docs/agent.md,
"Stopping"), so replica names stay the same from one run to the next.

If ``dev`` itself is killed abruptly (SIGKILL), the kernel ends its children
(``PR_SET_PDEATHSIG``): the server gets SIGTERM, the agents SIGKILL, so the engines (and
PostgreSQL) keep running and the next run adopts them through the agents' shard records,
as after any agent crash: nothing is rebuilt.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx

from app.usage_errors import print_command_error
from cli.client import AdminClient, ClientError
from cli.config import ConnectionSettings
from devcluster import admin
from devcluster.database import prepare_database, secret
from devcluster.demo_model import (
    MODEL,
    SERVED_BY,
    DevEngine,
    demo_spec,
    engine_conflict,
    served_by,
)
from devcluster.docker import DockerPostgres
from devcluster.errors import ChildExited, DevDatabaseError, DevError, NotReady
from devcluster.next_steps import CHAT_BODY, Where, next_steps
from devcluster.orchestrator import Processes
from devcluster.pki import ClusterPki, issue_pki
from devcluster.ports import (
    BLOCK_PORTS,
    LOOPBACK,
    EnginePortBlock,
    claim_engine_ports,
    port_is_free,
)
from devcluster.postgres import LocalPostgres
from devcluster.programs import AgentCommand, ServeCommand, gateway_url
from devcluster.readiness import wait_for
from devcluster.state_lock import StateDirLock, lock_state_dir

PROGRAM = "llmgw-dev"
"""The start of every error line, as of its usage errors: ``llmgw-dev: port 8081 ...``."""
TOKEN_NAME = "dev"
API_KEY_NAME = "dev"
NODES = ("dev-node-1", "dev-node-2")
FAKE_GPUS = "2x80GB"
SERVER_FLAGS = (
    *("--adoption-grace", "5", "--lost-timeout", "20", "--stability-window", "2"),
    *("--heartbeat-interval", "1", "--reconcile-interval", "0.5"),
)
START_WITHIN_S = 60.0
POLL_S = 0.2
CERTIFICATE_DAYS = 825
ROUTE_PROBE_BODY = CHAT_BODY.removesuffix("}") + ', "max_tokens": 1}'
"""The printed request, one token long: whether the gateway routes, not what a CPU engine
takes to write a whole answer."""


class StopRequested(Exception):
    """SIGINT or SIGTERM arrived: stop everything and exit 0."""


@dataclass(frozen=True)
class DevOptions:
    state_dir: Path
    admin_port: int
    agent_port: int
    replicas: int
    client_port: int = 8080
    engine: DevEngine = "simulator"

    @property
    def admin_url(self) -> str:
        return f"http://{LOOPBACK}:{self.admin_port}"

    @property
    def gateway_url(self) -> str:
        """Base URL of the OpenAI-compatible API."""
        return gateway_url(self.client_port)

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"


@dataclass(eq=False)
class DevCluster:
    """The processes of one ``dev`` run; ``start`` brings them up, ``stop`` ends them all."""

    options: DevOptions
    stop_requested: Callable[[], bool]
    processes: Processes = field(init=False)
    postgres: LocalPostgres | DockerPostgres | None = None
    engine_ports: EnginePortBlock | None = None
    state_lock: StateDirLock | None = None
    token: str = ""
    started_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.processes = Processes(self.options.logs, die_with_parent=True)

    def start(self) -> str:
        """Start everything and wait until the model serves; the next-steps text."""
        options = self.options
        self.state_lock = lock_state_dir(options.state_dir)
        for port, flag in (
            (options.admin_port, "--admin-port"),
            (options.agent_port, "--agent-port"),
            (options.client_port, "--client-port"),
        ):
            if not port_is_free(port):
                raise DevError(f"port {port} on {LOOPBACK} is in use; choose another with {flag}")
        spec = self._model_spec()
        options.logs.mkdir(parents=True, exist_ok=True)
        engine_ports = self.engine_ports = claim_engine_ports(options.state_dir)
        if engine_ports.moved_from is not None:
            old, new = engine_ports.moved_from, engine_ports.first
            _announce(
                f"llmgw-dev: warning: engine ports {old}-{old + BLOCK_PORTS - 1} of "
                f"{options.state_dir} are held by another running llmgw-dev; this run's "
                f"engines take {new}-{new + BLOCK_PORTS - 1}, and replicas placed on the old "
                "ports are replaced by replicas on the new ones",
                sys.stderr,
            )
        self._progress("preparing the database (PostgreSQL, migrations)")
        database = prepare_database(options.state_dir, _configured_database_url())
        self.postgres = database.postgres
        pki = issue_pki(
            options.state_dir / "pki",
            ca_name="llmgw dev CA",
            nodes=NODES,
            operators=(TOKEN_NAME,),
            server_hosts=("localhost",),
            days=CERTIFICATE_DAYS,
        )
        self.token = secret(options.state_dir / "admin-token")
        serve = self._serve_command(pki, database.runtime_url)
        self._progress("starting llmgw-server, waiting for it to lead")
        self.processes.start_server(
            "server", serve, log_path=options.logs / "server.log", append=True
        )
        settings = ConnectionSettings(admin_url=options.admin_url, token=self.token)
        with AdminClient(settings, timeout_s=5.0) as client:
            self._wait_for(lambda: _answers(admin.leads, client), "the server to lead")
            self._refuse_another_engine(client)
            self._progress(f"starting agents {', '.join(NODES)}, waiting for them to connect")
            for index, node in enumerate(NODES):
                self._start_agent(pki, serve, node, engine_ports.node_range(index))
            self._wait_for(
                lambda: _answers(lambda c: admin.nodes_connected(c, NODES), client),
                "both agents to connect",
            )
            desired = admin.declare_model(client, spec)
            self._progress(f"{MODEL} declared, waiting for {desired} serving replica(s)")
            try:
                self._wait_for(
                    lambda: len(admin.serving(client, MODEL)) >= desired,
                    f"{desired} serving replica(s)",
                )
            except NotReady as exc:
                raise NotReady(_with_why_short(str(exc), client)) from None
            key_path = options.state_dir / "api-key"
            api_key = admin.api_key(client, key_path, name=API_KEY_NAME, models=[MODEL])
        if desired > 0:
            self._progress(f"waiting for the gateway to route to {MODEL}")
            with httpx.Client(timeout=10.0, trust_env=False) as gateway:
                self._wait_for(
                    lambda: _answers_through_gateway(gateway, options, api_key),
                    "the gateway to route to the model",
                )
        where = Where(
            options.state_dir,
            options.gateway_url,
            options.admin_url,
            serve.agent_uri,
            NODES,
            FAKE_GPUS,
            MODEL,
            SERVED_BY[options.engine],
            database.owner_url,
        )
        return next_steps(where, self.token, api_key, self._log_paths())

    def watch(self) -> None:
        """Until a stop is requested (returns) or a child exits by itself (DevError)."""
        while not self.stop_requested():
            self._check_children()
            time.sleep(POLL_S)

    def started_anything(self) -> bool:
        return self.postgres is not None or bool(self.processes.children())

    def stop(self) -> None:
        for problem in self.processes.stop():
            print_command_error(PROGRAM, problem)
        if self.postgres is not None:
            try:
                self.postgres.stop()
            except DevDatabaseError as exc:
                print_command_error(PROGRAM, str(exc))
        if self.engine_ports is not None:
            self.engine_ports.release()

    def release_state_dir(self) -> None:
        """After ``stop``, or when nothing was started: the next run may have it."""
        if self.state_lock is not None:
            self.state_lock.release()
            self.state_lock = None

    # -- steps --------------------------------------------------------------------------

    def _serve_command(self, pki: ClusterPki, database_url: str) -> ServeCommand:
        options = self.options
        return ServeCommand(
            pki=pki,
            admin_port=options.admin_port,
            agent_port=options.agent_port,
            client_port=options.client_port,
            database_url=database_url,
            admin_tokens=((TOKEN_NAME, self.token),),
            flags=SERVER_FLAGS,
        )

    def _start_agent(
        self, pki: ClusterPki, serve: ServeCommand, node: str, ports: tuple[int, int]
    ) -> None:
        low, high = ports
        command = AgentCommand(
            servers=(serve.agent_uri,),
            node_id=node,
            credentials=pki.node(node),
            state_dir=self.options.state_dir / "agents" / node,
            fake_gpus=FAKE_GPUS,
            port_range=f"{low}-{high}",
            engines_on_exit="stop",
        )
        log_path = self.options.logs / f"{node}.log"
        self.processes.start_agent(node, command, log_path=log_path, append=True)

    def _model_spec(self) -> dict[str, object]:
        try:
            return demo_spec(self.options.engine, replicas=self.options.replicas)
        except (OSError, ValueError) as exc:  # ValueError: a model file that fails its hash
            raise DevError(f"the {MODEL} model's engine cannot be prepared: {exc}") from exc

    def _refuse_another_engine(self, client: AdminClient) -> None:
        """Before any agent starts an engine: the state directory's demo model must be on
        the engine asked for (``devcluster.demo_model``)."""
        declared = admin.declared_spec(client, MODEL)
        if declared is None:
            return
        conflict = engine_conflict(
            self.options.engine,
            served_by(declared.engine, declared.command),
            self.options.state_dir,
        )
        if conflict is not None:
            raise DevError(conflict)

    def _progress(self, step: str) -> None:
        """One line on stderr as each step of the start begins, with the seconds since the
        start: a slow start says where it is (stdout keeps only the next steps)."""
        elapsed = time.monotonic() - self.started_at
        _announce(f"llmgw-dev [{elapsed:5.1f}s] {step} ...", sys.stderr)

    def _wait_for(self, condition: Callable[[], bool], what: str) -> None:
        wait_for(
            condition,
            within_s=START_WITHIN_S,
            what=what,
            every_s=POLL_S,
            check=self._check_stop_and_children,
            hint=f"; see the logs in {self.options.logs}",
        )

    def _check_stop_and_children(self) -> None:
        if self.stop_requested():
            raise StopRequested
        self._check_children()

    def _check_children(self) -> None:
        for child in self.processes.children():
            if child.exited():
                raise ChildExited(child.name, child.process.returncode, child.log_path)

    def _log_paths(self) -> dict[str, Path]:
        paths = {child.name: child.log_path for child in self.processes.children()}
        if self.postgres is not None and self.postgres.state_dir is not None:
            paths["postgres"] = self.postgres.state_dir / "postgres.log"
        return paths


def _configured_database_url() -> str | None:
    return os.environ.get("LLMGW_DATABASE_URL") or None


def _answers(probe: Callable[[AdminClient], bool], client: AdminClient) -> bool:
    """``probe(client)``, False while the admin API does not answer yet."""
    try:
        return probe(client)
    except ClientError:
        return False


def _with_why_short(message: str, client: AdminClient) -> str:
    """``message`` and why the model is below its count, as the server says (a state
    directory whose model was scaled past what the fake GPUs hold, a node left draining)."""
    try:
        reasons = admin.why_short(client, MODEL)
    except ClientError:
        return message
    if not reasons:
        return message
    return f"{message}; {MODEL} is short: {'; '.join(reasons)} (llmgw-cli model {MODEL})"


def _answers_through_gateway(client: httpx.Client, options: DevOptions, api_key: str) -> bool:
    """Whether the gateway routes the printed request yet (it learns of the new key and the
    serving replicas within a second)."""
    try:
        answer = client.post(
            f"{options.gateway_url}/chat/completions",
            content=ROUTE_PROBE_BODY,
            headers={"content-type": "application/json", "authorization": f"Bearer {api_key}"},
        )
    except httpx.TransportError:
        return False
    return answer.status_code == 200


def run_dev(options: DevOptions) -> int:
    """Run the cluster until SIGINT or SIGTERM; the exit code (0 stopped, 1 failed)."""
    stopping: list[int] = []

    def request_stop(signum: int, _frame: object) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster = DevCluster(options, stop_requested=lambda: bool(stopping))
    code = 0
    try:
        print(cluster.start(), flush=True)
        cluster.watch()
    except StopRequested:
        pass  # Ctrl-C or SIGTERM: stop everything below and exit 0
    except DevError as exc:
        print_command_error(PROGRAM, str(exc))
        code = 1
    except ClientError as exc:
        print_command_error(PROGRAM, f"the admin API at {options.admin_url} failed: {exc}")
        code = 1
    except OSError as exc:  # the state directory cannot be written, most likely
        print_command_error(PROGRAM, str(exc))
        code = 1
    finally:
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        if cluster.started_anything():
            _announce("stopping the dev cluster ...")
            cluster.stop()
        cluster.release_state_dir()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if cluster.started_anything():
        _announce("stopped" if code == 0 else "stopped after the error above")
    return code


def _announce(line: str, stream: TextIO | None = None) -> None:
    """Print a line of progress or of the stop, which must happen even when nobody reads it
    any more: ``llmgw-dev 2>&1 | tee dev.log`` and Ctrl-C end ``tee`` too, so stdout (or
    stderr) is a closed pipe."""
    stream = stream or sys.stdout
    try:
        print(line, file=stream, flush=True)
    except BrokenPipeError:
        # What is still buffered and every later line go nowhere, rather than fail again
        # (at exit, too).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
