"""``llmgw-server dev``: a whole local cluster of real processes, in one command.

PostgreSQL (``app.devdb``, or ``LLMGW_DATABASE_URL``), a CA with its certificates, an
admin token, ``llmgw-server serve`` with its gateway, two ``llmgw-agent`` processes with
fake GPUs, a ``demo`` model whose engines are the simulator, and an API key for it.
Everything lives in one state directory and is reused by the next run: the log survives,
certificates, token and API key stay the same (a key revoked meanwhile is replaced).

Engine ports. Each state directory has a block of engine ports of its own
(``app.devports``), so several dev clusters, each with its own ``--state-dir`` and
listener ports, run side by side on one machine without their engines meeting.
The database has the two roles of production: ``dev`` migrates as the server's superuser
(or the role of ``LLMGW_DATABASE_URL``), which owns the schema, with ``llmgw_runtime`` as
the runtime role (its password generated once into the state directory), and ``serve``
connects as ``llmgw_runtime``.

Stopping. Ctrl-C or SIGTERM stops the agents (SIGTERM: they close their connections and,
by design, leave their engines running), then kills every engine process group the
agents' shard records name and removes those records, then stops the server, then the
local PostgreSQL. Nothing is left behind, and the log is not touched: scaling the model
to 0 instead would record a scale-down the next run would have to undo. With the records
gone, the next run's agents report no shards, so the control plane finds the replicas
lost once the adoption grace ends and places new ones at once (a failed shard would
count as a failure and delay placement by the model's backoff).

If ``dev`` itself is killed abruptly (SIGKILL), its server and agents get SIGTERM from
the kernel (``PR_SET_PDEATHSIG``), the engines and PostgreSQL keep running, and the next
run adopts the engines through the agents' shard records: nothing is rebuilt.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx
from cryptography import x509
from sqlalchemy.engine import make_url

from agent.engines.records import RecordStore, is_same_process
from app.devdb import DevDatabaseError, LocalPostgres, find_bindir, port_is_free
from app.devdocker import DockerPostgres, docker_answers
from app.devports import EnginePortBlock, EnginePortsUnavailable, claim_engine_ports
from app.domain.keys import prefix_of
from app.logs import configure_logging
from app.pki import (
    CertificateAuthority,
    build_ca,
    generate_key,
    issue_node,
    issue_operator,
    issue_server,
)
from app.pki.errors import PkiError
from app.pki.files import load_ca, write_ca, write_issued
from app.pki.keys import PrivateKey
from app.store import migrate as migrations
from app.store.database import driver_url
from app.store.errors import StoreError
from app.store.grants import DEFAULT_RUNTIME_ROLE, RuntimeRole

DEFAULT_STATE_DIR = Path(".llmgw/dev")
HOST = "127.0.0.1"
DATABASE = "llmgw"
MODEL = "demo"
TOKEN_NAME = "dev"
API_KEY_NAME = "dev"
NODES = ("dev-node-1", "dev-node-2")
FAKE_GPUS = "2x80GB"
ENGINE_NETWORKS = "127.0.0.0/8"
"""Every engine of a dev cluster listens on loopback: nothing else is ever contacted."""
SIMULATOR_FLAGS = "--max-num-seqs 16 --decode-base-ms 5 --prefill-ms-per-token 0.05"
SERVER_FLAGS = (
    *("--adoption-grace", "5", "--lost-timeout", "20", "--stability-window", "2"),
    *("--heartbeat-interval", "1", "--reconcile-interval", "0.5"),
)
START_WITHIN_S = 60.0
STOP_WITHIN_S = 10.0
POLL_S = 0.2
PR_SET_PDEATHSIG = 1
BIN = Path(sys.executable).parent
CA_DAYS = 3650
LEAF_DAYS = 825


class DevError(Exception):
    """The cluster cannot start or stopped by itself; the message says what to do."""


class StopRequested(Exception):
    """SIGINT or SIGTERM arrived: stop everything and exit 0."""


@dataclass(frozen=True)
class DevOptions:
    state_dir: Path
    admin_port: int
    agent_port: int
    replicas: int
    client_port: int = 8080

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.admin_port}"

    @property
    def gateway_url(self) -> str:
        """Base URL of the OpenAI-compatible API."""
        return f"http://{HOST}:{self.client_port}/v1"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"


@dataclass(eq=False)
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


@dataclass(eq=False)
class DevCluster:
    """The processes of one ``dev`` run; ``start`` brings them up, ``stop`` ends them all."""

    options: DevOptions
    stop_requested: Callable[[], bool]
    postgres: LocalPostgres | DockerPostgres | None = None
    server: Child | None = None
    agents: list[Child] = field(default_factory=list)
    engine_ports: EnginePortBlock | None = None
    token: str = ""

    def start(self) -> str:
        """Start everything and wait until the model serves; the next-steps text."""
        options = self.options
        for port, flag in (
            (options.admin_port, "--admin-port"),
            (options.agent_port, "--agent-port"),
            (options.client_port, "--client-port"),
        ):
            if not port_is_free(port):
                raise DevError(f"port {port} on {HOST} is in use; choose another with {flag}")
        options.logs.mkdir(parents=True, exist_ok=True)
        try:
            engine_ports = self.engine_ports = claim_engine_ports(options.state_dir)
        except EnginePortsUnavailable as exc:
            raise DevError(str(exc)) from exc
        database_url = self._database()
        pki = ensure_pki(options.state_dir / "pki", NODES)
        self.token = _admin_token(options.state_dir / "admin-token")
        self.server = self._spawn(
            "server", _server_argv(options, pki), self.token, database_url=database_url
        )
        with httpx.Client(
            base_url=options.admin_url,
            headers={"authorization": f"Bearer {self.token}"},
            timeout=5.0,
        ) as admin:
            self._wait_for(lambda: _leads(admin), "the server to lead")
            for index, node in enumerate(NODES):
                ports = engine_ports.node_range(index)
                self.agents.append(self._spawn(node, _agent_argv(options, pki, node, ports)))
            self._wait_for(lambda: _nodes_connected(admin), "both agents to connect")
            desired = _declare_model(admin, options.replicas)
            self._wait_for(lambda: len(_serving(admin)) >= desired, f"{desired} serving replica(s)")
            api_key = _api_key(admin, options.state_dir / "api-key")
        if desired > 0:
            with httpx.Client(timeout=10.0) as client:
                self._wait_for(
                    lambda: _answers_through_gateway(client, options, api_key),
                    "the gateway to route to the model",
                )
        return next_steps(options, self.token, api_key, self._log_paths())

    def watch(self) -> None:
        """Until a stop is requested (returns) or a child exits by itself (DevError)."""
        while not self.stop_requested():
            self._check_children()
            time.sleep(POLL_S)

    def started_anything(self) -> bool:
        return self.postgres is not None or self.server is not None

    def stop(self) -> None:
        for agent in self.agents:
            _terminate(agent)
        for agent in self.agents:
            _kill_engines(_agent_state_dir(self.options, agent.name))
        if self.server is not None:
            _terminate(self.server)
        if self.postgres is not None:
            try:
                self.postgres.stop()
            except DevDatabaseError as exc:
                print(f"error: {exc}", file=sys.stderr)
        if self.engine_ports is not None:
            self.engine_ports.release()

    # -- steps --------------------------------------------------------------------------

    def _database(self) -> str:
        """The database migrated, with its runtime role; the runtime role's URL."""
        url = os.environ.get("LLMGW_DATABASE_URL")
        try:
            if url is None:
                postgres = self._local_or_docker_postgres()
                postgres.start()
                self.postgres = postgres
                asyncio.run(_create_database(postgres.url(), DATABASE))
                url = postgres.url(DATABASE)
            password = _secret(self.options.state_dir / "runtime-password")
            migrations.upgrade(url, runtime=RuntimeRole(DEFAULT_RUNTIME_ROLE, password))
        except DevDatabaseError as exc:
            raise DevError(str(exc)) from exc
        except (OSError, StoreError, asyncpg.PostgresError) as exc:
            raise DevError(f"cannot prepare the database: {exc}") from exc
        as_runtime = make_url(url).set(username=DEFAULT_RUNTIME_ROLE, password=password)
        return as_runtime.render_as_string(hide_password=False)

    def _local_or_docker_postgres(self) -> LocalPostgres | DockerPostgres:
        """The local PostgreSQL binaries when installed, else a container when Docker
        answers (each kept in the state directory, so the next run finds the same log)."""
        try:
            find_bindir()
        except DevDatabaseError as exc:
            if docker_answers():
                return DockerPostgres(self.options.state_dir / "postgres-docker")
            raise DevDatabaseError(f"{exc}; and no Docker daemon answers either") from exc
        return LocalPostgres(self.options.state_dir / "postgres", durable=True)

    def _spawn(
        self, name: str, argv: list[str], admin_token: str = "", database_url: str = ""
    ) -> Child:
        log_path = self.options.logs / f"{name}.log"
        environment = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("LLMGW_AGENT_", "LLMGW_ADMIN_", "LLMGW_TLS_"))
        }
        if admin_token:
            environment["LLMGW_ADMIN_TOKENS"] = f"{TOKEN_NAME}:{admin_token}"
        if database_url:  # in the environment, not on the command line: it holds a password
            environment["LLMGW_DATABASE_URL"] = database_url
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,  # a terminal's Ctrl-C reaches dev only, which stops all
                preexec_fn=_die_with_parent(os.getpid()),
            )
        return Child(name, process, log_path)

    def _wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_WITHIN_S
        while True:
            if self.stop_requested():
                raise StopRequested
            self._check_children()
            try:
                if condition():
                    return
            except httpx.TransportError:
                pass  # not listening yet: the deadline below decides
            if time.monotonic() > deadline:
                raise DevError(
                    f"timed out after {START_WITHIN_S:.0f}s waiting for {what}; "
                    f"see the logs in {self.options.logs}"
                )
            time.sleep(POLL_S)

    def _check_children(self) -> None:
        for child in (self.server, *self.agents):
            if child is not None and child.process.poll() is not None:
                raise DevError(
                    f"{child.name} exited with code {child.process.returncode}; "
                    f"see {child.log_path}"
                )

    def _log_paths(self) -> dict[str, Path]:
        paths = {child.name: child.log_path for child in (self.server, *self.agents) if child}
        if self.postgres is not None and self.postgres.state_dir is not None:
            paths["postgres"] = self.postgres.state_dir / "postgres.log"
        return paths


# -- certificates and the admin token -------------------------------------------------------


@dataclass(frozen=True)
class DevPki:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def certificate(self, stem: str) -> Path:
        return self.directory / f"{stem}.crt"

    def key(self, stem: str) -> Path:
        return self.directory / f"{stem}.key"


def ensure_pki(directory: Path, nodes: tuple[str, ...]) -> DevPki:
    """The CA, a server certificate for 127.0.0.1 and localhost, a certificate per node and
    one for the operator ``dev``; whatever exists already is kept."""
    pki = DevPki(directory)
    now = datetime.now(UTC)
    try:
        if not pki.ca.exists():
            write_ca(directory, build_ca(generate_key(), "llmgw dev CA", now, CA_DAYS), force=False)
        ca = load_ca(directory)
        for stem in ("server", "operator-dev", *(f"node-{node}" for node in nodes)):
            if not pki.certificate(stem).exists():
                key = generate_key()
                certificate = _issue_leaf(ca, stem, key, now)
                write_issued(directory, stem, certificate, key, force=True)
    except PkiError as exc:
        raise DevError(f"cannot prepare the certificates in {directory}: {exc}") from exc
    return pki


def _issue_leaf(
    ca: CertificateAuthority, stem: str, key: PrivateKey, now: datetime
) -> x509.Certificate:
    if stem == "server":
        return issue_server(ca, key, ["localhost"], [ipaddress.ip_address(HOST)], now, LEAF_DAYS)
    if stem.startswith("operator-"):
        return issue_operator(ca, key, stem.removeprefix("operator-"), now, LEAF_DAYS)
    return issue_node(ca, key, stem.removeprefix("node-"), now, LEAF_DAYS)


def _admin_token(path: Path) -> str:
    """The admin token stored at ``path`` (mode 0600), generated the first time."""
    return _secret(path)


def _secret(path: Path) -> str:
    """The secret stored at ``path`` (mode 0600), generated the first time."""
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


async def _create_database(admin_url: str, name: str) -> None:
    connection = await asyncpg.connect(driver_url(admin_url))
    try:
        if not await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()


# -- child processes --------------------------------------------------------------------------


def _program(name: str) -> str:
    beside_python = BIN / name
    return str(beside_python) if beside_python.exists() else (shutil.which(name) or name)


def _server_argv(options: DevOptions, pki: DevPki) -> list[str]:
    return [
        _program("llmgw-server"),
        "serve",
        *("--admin-host", HOST, "--admin-port", str(options.admin_port)),
        *("--agent-host", HOST, "--agent-port", str(options.agent_port)),
        *("--client-host", HOST, "--client-port", str(options.client_port)),
        *("--tls-cert", str(pki.certificate("server")), "--tls-key", str(pki.key("server"))),
        *("--tls-ca", str(pki.ca), "--engine-networks", ENGINE_NETWORKS),
        *SERVER_FLAGS,
    ]


def _agent_argv(options: DevOptions, pki: DevPki, node: str, ports: tuple[int, int]) -> list[str]:
    low, high = ports
    return [
        _program("llmgw-agent"),
        *("--server", f"wss://{HOST}:{options.agent_port}", "--node-id", node),
        *("--cert", str(pki.certificate(f"node-{node}")), "--key", str(pki.key(f"node-{node}"))),
        *("--ca", str(pki.ca), "--state-dir", str(_agent_state_dir(options, node))),
        *("--fake-gpus", FAKE_GPUS, "--address", HOST),
        *("--port-range", f"{low}-{high}"),
    ]


def _agent_state_dir(options: DevOptions, node: str) -> Path:
    return options.state_dir / "agents" / node


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """Run in the child before exec: SIGTERM it when ``dev`` dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, not in the child

    def arrange() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # dev died before prctl took effect
            os._exit(1)

    return arrange


def _terminate(child: Child) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.process.send_signal(signal.SIGTERM)
    try:
        child.process.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait(timeout=STOP_WITHIN_S)


def _kill_engines(agent_state_dir: Path) -> None:
    """SIGTERM every engine process group the stopped agent recorded, SIGKILL what is left
    after the grace, and forget the records (see the module docstring)."""
    store = RecordStore(agent_state_dir)
    records = store.load_all()
    for signum in (signal.SIGTERM, signal.SIGKILL):
        alive = [record for record in records if is_same_process(record)]
        for record in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signum)
        deadline = time.monotonic() + STOP_WITHIN_S / 2
        while any(is_same_process(r) for r in alive) and time.monotonic() < deadline:
            time.sleep(0.05)
    for record in records:
        store.remove(record.key)


# -- the admin API ----------------------------------------------------------------------------


def _leads(admin: httpx.Client) -> bool:
    answer = admin.get("/readyz").json()
    return bool(answer.get("ready")) and answer.get("role") == "leader"


def _nodes_connected(admin: httpx.Client) -> bool:
    nodes = admin.get("/admin/v1/nodes").raise_for_status().json()
    return set(NODES) <= {node["id"] for node in nodes if node["connected"]}


def _declare_model(admin: httpx.Client, replicas: int) -> int:
    """Declare ``demo`` unless the log already has it; its desired replica count."""
    existing = admin.get(f"/admin/v1/models/{MODEL}")
    if existing.status_code == 200:
        desired: int = existing.json()["desired"]
        return desired
    command = f"{_program('llmgw-sim-engine')} --port {{port}} --model {{model}} {SIMULATOR_FLAGS}"
    answer = admin.put(
        f"/admin/v1/models/{MODEL}",
        json={"command": command, "replicas": replicas, "startup_timeout_s": 60},
    )
    if answer.status_code >= 400:
        raise DevError(f"cannot declare model {MODEL}: {answer.status_code} {answer.text}")
    return replicas


def _serving(admin: httpx.Client) -> list[str]:
    replicas = admin.get(
        "/admin/v1/replicas", params={"model": MODEL, "phase": "serving"}
    ).raise_for_status()
    return sorted(replica["id"] for replica in replicas.json())


def _api_key(admin: httpx.Client, path: Path) -> str:
    """The API key stored at ``path`` (mode 0600) while it is live; else a new one for the
    demo model, created through the admin API (a live key of the same name, whose secret
    was lost with the file, is revoked first)."""
    keys = admin.get("/admin/v1/keys").raise_for_status().json()
    live = {key["prefix"]: key for key in keys if not key["revoked"]}
    if path.exists():
        stored = path.read_text().strip()
        if prefix_of(stored) in live:
            return stored
    for key in live.values():
        if key["name"] == API_KEY_NAME:
            admin.delete(f"/admin/v1/keys/{key['prefix']}").raise_for_status()
    answer = admin.post("/admin/v1/keys", json={"name": API_KEY_NAME, "models": [MODEL]})
    if answer.status_code >= 400:
        raise DevError(f"cannot create an API key: {answer.status_code} {answer.text}")
    created: str = answer.json()["key"]
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(created + "\n")
    return created


def _answers_through_gateway(client: httpx.Client, options: DevOptions, api_key: str) -> bool:
    """Whether the gateway routes the printed request yet (it learns of the new key and the
    serving replicas within a second)."""
    answer = client.post(
        f"{options.gateway_url}/chat/completions",
        content=CHAT_BODY,
        headers={"content-type": "application/json", "authorization": f"Bearer {api_key}"},
    )
    return answer.status_code == 200


# -- what to do next ----------------------------------------------------------------------------


CHAT_BODY = '{"model": "demo", "messages": [{"role": "user", "content": "Hello!"}]}'


def next_steps(options: DevOptions, token: str, api_key: str, logs: dict[str, Path]) -> str:
    cli = (
        "llmgw-cli" if shutil.which("llmgw-cli") == _program("llmgw-cli") else _program("llmgw-cli")
    )
    python = "python" if shutil.which("python") == sys.executable else sys.executable
    log_lines = "\n".join(f"  {name:<12} {path}" for name, path in logs.items())
    curl = shlex.join(
        [
            "curl",
            f"{options.gateway_url}/chat/completions",
            *("-H", f"Authorization: Bearer {api_key}"),
            *("-H", "Content-Type: application/json", "-d", CHAT_BODY),
        ]
    )
    return f"""\
llmgw dev cluster is up: state in {options.state_dir}
  gateway      {options.gateway_url} (OpenAI-compatible; API key in {options.state_dir / "api-key"})
  admin API    {options.admin_url} (token in {options.state_dir / "admin-token"})
  agent hub    wss://{HOST}:{options.agent_port}
  nodes        {", ".join(NODES)} ({FAKE_GPUS} fake GPUs each)
  model        {MODEL}, served by the engine simulator
logs:
{log_lines}

Next steps, in another shell:
  export LLMGW_ADMIN_URL={options.admin_url} LLMGW_ADMIN_TOKEN={token}
  {cli} history model {MODEL}
  {curl}
Or with the openai SDK:
{shlex.quote(python)} - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{options.gateway_url}", api_key="{api_key}")
reply = client.chat.completions.create(
    model="{MODEL}", messages=[{{"role": "user", "content": "Hello!"}}]
)
print(reply.choices[0].message.content)
PY
Press Ctrl-C to stop every process started here; the next run reuses {options.state_dir}.
"""


# -- the command ------------------------------------------------------------------------------


def dev_command(
    *,
    state_dir: Path = DEFAULT_STATE_DIR,
    admin_port: int = 8081,
    agent_port: int = 8443,
    client_port: int = 8080,
    replicas: int = 2,
) -> None:
    """Run a whole local cluster until Ctrl-C: PostgreSQL (unless LLMGW_DATABASE_URL is
    set), a CA and certificates, this control plane with its gateway on --client-port, two
    agents with fake GPUs, a demo model served by the engine simulator, and an API key for
    it. Everything is kept in --state-dir and reused by the next run; Ctrl-C stops every
    process it started.

    Example: llmgw-server dev --admin-port 8081 --agent-port 8443 --client-port 8080
    """
    configure_logging()
    if replicas < 0:
        print(f"error: --replicas must not be negative, not {replicas}", file=sys.stderr)
        sys.exit(1)
    options = DevOptions(state_dir.resolve(), admin_port, agent_port, replicas, client_port)
    sys.exit(run_dev(options))


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
        print(f"error: {exc}", file=sys.stderr, flush=True)
        code = 1
    except httpx.HTTPError as exc:
        print(f"error: the admin API at {options.admin_url} failed: {exc}", file=sys.stderr)
        code = 1
    finally:
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        if cluster.started_anything():
            print("stopping the dev cluster ...", flush=True)
            cluster.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if cluster.started_anything():
        print("stopped" if code == 0 else "stopped after the error above", flush=True)
    return code
