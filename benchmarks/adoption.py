"""Restart and adoption: a control plane restarts under a running fleet and adopts it.

    python benchmarks/adoption.py [--agents 1000] [--replicas 4000] [--runs 1]
        [--workdir DIR] [--settle 5] [--profile] [--heartbeat-interval 1] [--timeout 120]
    python benchmarks/adoption.py --agents 3000 --replicas 12000 --heartbeat-interval 5

For each run: a fresh migrated database (see ``benchmarks/common.py``) holding the log a
previous leader left behind: a ``leadership`` row at epoch 1 and, appended with
``Meta(actor="reconciler", epoch=1)``, ~40 models, ``--agents`` connected nodes of 8 GPUs
and ``--replicas`` serving single-shard replicas (placed, starting, ready, serving). Then
``llmgw-server serve --adoption-grace 30`` is spawned (the control plane under test; it
takes epoch 2), and at the same moment a second process starts the agents' side: one
simulated agent per node, real websockets over mTLS with a node certificate each, dialling
with the real agent's backoff as agents do when their control plane went away. Each sends
a ``hello`` whose inventory reports exactly the shards the log has on its node (replica,
shard, port, pid, ``ready``), then a heartbeat with those shards every second.

Measured from the spawn and from the election (``leadership.epoch`` moving past 1), by
polling the log every 100 ms for events after the old history: every node connected
(distinct ``node_connected``) and every replica adopted (distinct ``replica_adopted``);
then, ``--settle`` seconds later, every event the new leader appended, by type (the target
is no ``replica_placed`` and no ``stray_stopped``). The control plane's CPU (utime + stime,
in cores) and RSS are sampled every second, and the agents' process's CPU is reported
beside it. From the control plane's log: when the hub had every hello, when hellos were
recorded, and every ``reconcile_pass`` (when it ended, how long it took, what it
appended). Target: every shard adopted within 15 s of the spawn.

This is the mass restart: every agent reconnecting at once with its report. The rate at
which the new leader appends meanwhile is counted from the log itself (``recorded_at`` of
every event after the old history, by second): events a second from its first event to
its last, and the busiest second. The store stamps an append's events with one time, so
the busiest second holds a whole batch, however long its commit took.

Certificates are issued once per ``--workdir`` (see ``benchmarks/agents.py``). Results are
printed and written to ``benchmarks/results/adoption-<timestamp>.json``;
``docs/performance.md`` ("Restart and adoption") discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import ssl
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

# Run as a script, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from agent.connection import Backoff
from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    GpuInfo,
    ModelDeclared,
    NodeConnected,
    NodeRegistered,
    ReplicaPlaced,
    ReplicaServing,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    model_stream,
    node_stream,
    replica_id_for,
    replica_stream,
)
from app.domain.model_spec import ModelSpec
from app.pki.tls import client_ssl_context
from app.store.database import create_engine
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from benchmarks.agents import (
    GPUS_PER_NODE,
    SERVER_COMMAND,
    Certificates,
    certificates_for,
    cpu_seconds,
    free_port,
    gpu_reports,
    node_address,
    node_id,
    profiled,
    rss_mib,
)
from benchmarks.common import (
    Machine,
    bench_server,
    describe_machine,
    format_table,
    fresh_database,
    load_average,
    median,
    runtime_url,
    stop_on_sigterm,
    write_results,
)
from wire.messages import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    Heartbeat,
    HeartbeatShard,
    Hello,
    ShardReport,
    Welcome,
    decode_from_server,
    encode,
)

MODELS = 40
FIRST_PORT = 20_000
FIRST_PID = 10_000
PREVIOUS_EPOCH = 1
ADOPTION_GRACE_S = 30.0
HEARTBEAT_INTERVAL_S = 1.0
TARGET_ADOPTED_S = 15.0
APPEND_BATCH = 250
POLL_S = 0.1
SAMPLE_S = 1.0
RUN_TIMEOUT_S = 120.0
SERVER_STOP_TIMEOUT_S = 60.0
OPEN_TIMEOUT_S = 10.0
WELCOME_TIMEOUT_S = 10.0
STARTED_AT = datetime(2026, 11, 1, tzinfo=UTC)
WRITER = Meta(actor="reconciler", epoch=PREVIOUS_EPOCH)


# -- the fleet the log describes and the agents report --------------------------------------


class Shard(msgspec.Struct, frozen=True, kw_only=True):
    """One single-shard replica where the previous leader left it."""

    replica_id: str
    model: str
    number: int
    node: int
    gpu: int
    port: int
    pid: int


def layout(agents: int, replicas: int) -> list[Shard]:
    """``replicas`` replicas over ``min(MODELS, replicas)`` models, round-robin over the
    nodes, each on a GPU and port of its own."""
    if replicas > agents * GPUS_PER_NODE:
        raise ValueError(f"{replicas} single-GPU replicas do not fit on {agents} nodes")
    models = min(MODELS, replicas)
    return [
        Shard(
            replica_id=replica_id_for(f"model-{r % models}", r // models + 1),
            model=f"model-{r % models}",
            number=r // models + 1,
            node=r % agents,
            gpu=r // agents,
            port=FIRST_PORT + r // agents,
            pid=FIRST_PID + r,
        )
        for r in range(replicas)
    ]


def hello(number: int, shards: Sequence[Shard]) -> Hello:
    return Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=node_id(number),
        agent_version="benchmark",
        address=node_address(number),
        labels={"pool": "benchmark"},
        port_range=(FIRST_PORT, FIRST_PORT + 999),
        gpus=gpu_reports(number),
        shards=tuple(
            ShardReport(
                replica_id=s.replica_id,
                shard_index=0,
                model=s.model,
                port=s.port,
                gpus=(s.gpu,),
                pid=s.pid,
                state="ready",
                started_at=STARTED_AT,
            )
            for s in shards
        ),
    )


def by_node(shards: Sequence[Shard], agents: int) -> list[list[Shard]]:
    nodes: list[list[Shard]] = [[] for _ in range(agents)]
    for shard in shards:
        nodes[shard.node].append(shard)
    return nodes


# -- the log a previous leader left ----------------------------------------------------------


def history(agents: int, shards: Sequence[Shard]) -> list[list[tuple[str, AnyEvent]]]:
    """The old log in batches: models, then nodes, then replicas."""
    desired = Counter(s.model for s in shards)
    models: list[tuple[str, AnyEvent]] = [
        (
            model_stream(m),
            ModelDeclared(model=m, spec=ModelSpec(name=m, command="vllm", replicas=n)),
        )
        for m, n in sorted(desired.items())
    ]
    nodes: list[tuple[str, AnyEvent]] = []
    for number in range(agents):
        gpus = tuple(GpuInfo(**msgspec.structs.asdict(g)) for g in gpu_reports(number))
        node, at = node_id(number), node_address(number)
        nodes.append((node_stream(node), NodeRegistered(node_id=node, address=at, gpus=gpus)))
        nodes.append((node_stream(node), NodeConnected(node_id=node, address=at, gpus=gpus)))
    replicas: list[tuple[str, AnyEvent]] = []
    for s in shards:
        node = node_id(s.node)
        placement = ShardPlacement(index=0, node_id=node, gpus=(s.gpu,), port=s.port)
        stream = replica_stream(s.replica_id)
        replicas += [
            (stream, ReplicaPlaced(replica_id=s.replica_id, model=s.model, number=s.number,
                                   shards=(placement,))),
            (stream, ShardStarting(replica_id=s.replica_id, shard_index=0, node_id=node,
                                   pid=s.pid)),
            (stream, ShardReady(replica_id=s.replica_id, shard_index=0, node_id=node)),
            (stream, ReplicaServing(replica_id=s.replica_id)),
        ]  # fmt: skip
    events = [models, *_chunks(nodes, 2 * APPEND_BATCH), *_chunks(replicas, 4 * APPEND_BATCH)]
    return [batch for batch in events if batch]


def _chunks(steps: list[tuple[str, AnyEvent]], size: int) -> list[list[tuple[str, AnyEvent]]]:
    return [steps[i : i + size] for i in range(0, len(steps), size)]


async def write_history(url: str, agents: int, shards: Sequence[Shard]) -> int:
    """The old leader's row and log; returns the last position it holds."""
    db = await asyncpg.connect(url)
    try:
        await db.execute(
            "INSERT INTO leadership (id, epoch, holder, acquired_at) "
            "VALUES (1, $1, 'previous-server', now())",
            PREVIOUS_EPOCH,
        )
        engine = create_engine(url, pool_size=1)
        try:
            store = PostgresEventStore(engine)
            for batch in history(agents, shards):
                requests: dict[str, list[NewEvent]] = {}
                for stream, event in batch:
                    requests.setdefault(stream, []).append(NewEvent(event))
                await store.append_many(
                    [AppendRequest(stream, None, events) for stream, events in requests.items()],
                    WRITER,
                )
        finally:
            await engine.dispose()
        last: int = await db.fetchval("SELECT max(position) FROM events")
        return last
    finally:
        await db.close()


# -- the agents' side: one process, one loop --------------------------------------------------


class AdoptingAgent:
    """A node whose engines kept running while its control plane was away: it dials with
    the real agent's backoff, says hello with its shards, then heartbeats; it answers no
    command (any the server sends shows in the log as a placement or a stray)."""

    def __init__(
        self, number: int, shards: Sequence[Shard], context: ssl.SSLContext, uri: str
    ) -> None:
        self._hello = encode(hello(number, shards))
        self._beat = tuple(HeartbeatShard(replica_id=s.replica_id, shard_index=0, state="ready")
                           for s in shards)  # fmt: skip
        # Dialled from the address it advertises, as a real node is (the hub checks).
        self._source = (node_address(number), 0)
        self._context = context
        self._uri = uri

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                async with connect(
                    self._uri,
                    ssl=self._context,
                    max_size=MAX_MESSAGE_BYTES,
                    open_timeout=OPEN_TIMEOUT_S,
                    proxy=None,
                    local_addr=self._source,
                ) as websocket:
                    backoff.reset()
                    await self._converse(websocket)
            except (OSError, TimeoutError, WebSocketException):
                pass
            await asyncio.sleep(backoff.next_delay())

    async def _converse(self, websocket: ClientConnection) -> None:
        await websocket.send(self._hello, text=True)
        async with asyncio.timeout(WELCOME_TIMEOUT_S):
            welcome = decode_from_server(await websocket.recv())
        if not isinstance(welcome, Welcome):
            raise WebSocketException(f"expected welcome, got {type(welcome).__name__}")
        beating = asyncio.create_task(self._heartbeat(websocket, welcome.heartbeat_interval_s))
        try:
            async for _ in websocket:
                pass
        finally:
            beating.cancel()

    async def _heartbeat(self, websocket: ClientConnection, interval: float) -> None:
        for seq in range(2**62):
            await asyncio.sleep(interval)
            await websocket.send(encode(Heartbeat(seq=seq, shards=self._beat)), text=True)


async def run_agents(port: int, certificates: Certificates, agents: int, replicas: int) -> None:
    """The load process: builds every TLS context, says ``ready``, dials on ``go`` and runs
    until ``stop`` (or the end of stdin)."""
    nodes = by_node(layout(agents, replicas), agents)
    fleet = [
        AdoptingAgent(n, nodes[n], client_ssl_context(certificates.ca, *certificates.node(n)),
                      f"wss://127.0.0.1:{port}")
        for n in range(agents)
    ]  # fmt: skip
    print("ready", flush=True)
    if await asyncio.to_thread(sys.stdin.readline) != "go\n":
        return
    tasks = [asyncio.create_task(agent.run()) for agent in fleet]
    await asyncio.to_thread(sys.stdin.readline)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def agents_process(
    port: int, certificates: Certificates, agents: int, replicas: int
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The load process, once its TLS contexts are built; told to stop on exit."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--load-port", str(port),
        "--workdir", str(certificates.directory),
        "--agents", str(agents), "--replicas", str(replicas),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        if await process.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the load process exited ({await process.wait()})")
        yield process
    finally:
        with contextlib.suppress(ConnectionError):
            process.stdin.write(b"stop\n")
            await process.stdin.drain()
        try:
            await asyncio.wait_for(process.wait(), 20)
        except TimeoutError:
            process.kill()
            await process.wait()


# -- the control plane under test -------------------------------------------------------------


@contextlib.asynccontextmanager
async def server(
    url: str,
    certificates: Certificates,
    agent_port: int,
    log: Path,
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``llmgw-server serve`` as a child, right after its spawn; SIGTERM on exit. (As
    ``benchmarks/agents.py``'s ``control_plane``, which picks its own agent port and
    returns only once the hub listens: here the agents must dial from the spawn on.)"""
    cert, key = certificates.server()
    arguments = [
        "serve", "--agent-host", "127.0.0.1", "--agent-port", str(agent_port),
        "--admin-host", "127.0.0.1", "--admin-port", str(free_port()),
        "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(certificates.ca),
        "--heartbeat-interval", str(heartbeat_interval_s),
        "--adoption-grace", str(ADOPTION_GRACE_S), "--no-gateway",
        "--engine-networks", "127.0.0.0/8",
    ]  # fmt: skip
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            SERVER_COMMAND, *arguments,
            stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=output,
            # As the runtime role, as in production; not on the command line: a password.
            env={**os.environ, "LLMGW_DATABASE_URL": runtime_url(url)},
        )  # fmt: skip
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), SERVER_STOP_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()


# -- one run ----------------------------------------------------------------------------------


class Sample(msgspec.Struct, frozen=True):
    at_s: float
    cpu_cores: float
    rss_mib: float


class Pass(msgspec.Struct, frozen=True):
    """One ``reconcile_pass`` line (the control plane logs the passes that did something)."""

    ended_s: float
    duration_s: float
    events: dict[str, int]


class ServerLog(msgspec.Struct, frozen=True, kw_only=True):
    """What the control plane's log says, in seconds since the spawn."""

    hellos_s: float | None
    """When the hub had logged every agent's hello ("agent_connected"), recorded or not."""
    first_recorded_s: float | None
    last_recorded_s: float | None
    """The first and the last hello recorded in the log ("fleet_events_recorded")."""
    passes: list[Pass]


class EventRate(msgspec.Struct, frozen=True, kw_only=True):
    events: int
    seconds: int
    """From the first event's second to the last event's, both counted."""
    per_s: float
    peak_per_s: int


def event_rate(per_second: Sequence[tuple[int, int]]) -> EventRate | None:
    """The rate of events appended, from ``(second, events)`` for the seconds that had any
    (None without any)."""
    if not per_second:
        return None
    seconds = [second for second, _ in per_second]
    events = sum(count for _, count in per_second)
    span = max(seconds) - min(seconds) + 1
    return EventRate(
        events=events,
        seconds=span,
        per_s=round(events / span, 1),
        peak_per_s=max(count for _, count in per_second),
    )


EVENTS_BY_SECOND = """
    SELECT floor(extract(epoch FROM recorded_at))::bigint, count(*)
    FROM events WHERE position > $1 GROUP BY 1 ORDER BY 1
"""


class Run(msgspec.Struct, frozen=True, kw_only=True):
    load_average: tuple[float, float, float]
    elected_s: float | None
    all_connected_s: float | None
    all_adopted_s: float | None
    connected: int
    adopted: int
    events_at_adopted: dict[str, int]
    events_after_settle: dict[str, int]
    cpu_cores_mean: float
    """Spawn to all adopted (or to the give-up), the whole process including its start."""
    agents_cpu_cores_mean: float
    """The load process over the same time: its TLS handshakes share this machine's cores."""
    cpu_samples: list[Sample]
    rss_peak_mib: float
    server_log: ServerLog
    event_rate: EventRate | None = None
    """What the new leader appended, by second, until the end of the settle time."""

    def after_election(self, seconds: float | None) -> float | None:
        if seconds is None or self.elected_s is None:
            return None
        return round(seconds - self.elected_s, 2)


NEW_EVENTS = """
    SELECT type, count(*), count(DISTINCT node_id), count(DISTINCT replica_id)
    FROM events WHERE position > $1 GROUP BY type
"""


async def measure(
    url: str, certificates: Certificates, arguments: argparse.Namespace, log: Path
) -> Run:
    agents, replicas = arguments.agents, arguments.replicas
    history_end = await write_history(url, agents, layout(agents, replicas))
    port = free_port()
    db = await asyncpg.connect(url)
    try:
        async with agents_process(port, certificates, agents, replicas) as load:
            assert load.stdin is not None
            started_load = load_average()
            agents_cpu_before = cpu_seconds(load.pid)
            spawned, spawned_at = time.monotonic(), datetime.now(UTC)
            async with server(url, certificates, port, log, arguments.heartbeat_interval) as plane:
                load.stdin.write(b"go\n")
                await load.stdin.drain()
                async with profiled(
                    plane.pid, log.with_suffix(".pyspy") if arguments.profile else None
                ):
                    seen = await _watch(
                        db, plane, history_end, spawned, agents, replicas, arguments.timeout
                    )
                    elapsed = time.monotonic() - spawned
                    cpu_mean = cpu_seconds(plane.pid) / elapsed
                    agents_cpu = (cpu_seconds(load.pid) - agents_cpu_before) / elapsed
                    at_adopted = await _new_events(db, history_end)
                    await asyncio.sleep(arguments.settle)
                    after_settle = await _new_events(db, history_end)
                    by_second = await db.fetch(EVENTS_BY_SECOND, history_end)
                samples = seen.samples
                log_size = (await asyncio.to_thread(log.stat)).st_size
    finally:
        await db.close()
    return Run(
        load_average=started_load,
        elected_s=seen.elected,
        all_connected_s=seen.connected_at,
        all_adopted_s=seen.adopted_at,
        connected=seen.connected,
        adopted=seen.adopted,
        events_at_adopted=at_adopted,
        events_after_settle=after_settle,
        cpu_cores_mean=round(cpu_mean, 2),
        agents_cpu_cores_mean=round(agents_cpu, 2),
        cpu_samples=samples,
        rss_peak_mib=max((s.rss_mib for s in samples), default=0.0),
        server_log=read_server_log(log, log_size, spawned_at, agents),
        event_rate=event_rate([(row[0], row[1]) for row in by_second]),
    )


class _Seen:
    """What the watch saw, in seconds since the spawn."""

    def __init__(self) -> None:
        self.elected: float | None = None
        self.connected_at: float | None = None
        self.adopted_at: float | None = None
        self.connected = 0
        self.adopted = 0
        self.samples: list[Sample] = []


async def _watch(
    db: asyncpg.Connection,
    plane: asyncio.subprocess.Process,
    history_end: int,
    spawned: float,
    agents: int,
    replicas: int,
    timeout_s: float = RUN_TIMEOUT_S,
) -> _Seen:
    """Polls the log until every replica is adopted or ``timeout_s`` passed."""
    seen = _Seen()
    next_sample, cpu_before = spawned + SAMPLE_S, 0.0
    while (now := time.monotonic()) - spawned < timeout_s:
        if plane.returncode is not None:
            raise RuntimeError(f"llmgw-server exited ({plane.returncode})")
        at = round(now - spawned, 2)
        if seen.elected is None:
            if await db.fetchval("SELECT epoch FROM leadership WHERE id = 1") > PREVIOUS_EPOCH:
                seen.elected = at
        else:
            rows = {row[0]: row for row in await db.fetch(NEW_EVENTS, history_end)}
            seen.connected = rows["node_connected"][2] if "node_connected" in rows else 0
            seen.adopted = rows["replica_adopted"][3] if "replica_adopted" in rows else 0
            if seen.connected_at is None and seen.connected >= agents:
                seen.connected_at = at
            if seen.adopted >= replicas:
                seen.adopted_at = at
                return seen
        if now >= next_sample:
            cpu = cpu_seconds(plane.pid)
            seen.samples.append(
                Sample(at, round((cpu - cpu_before) / SAMPLE_S, 2), rss_mib(plane.pid))
            )
            next_sample, cpu_before = next_sample + SAMPLE_S, cpu
        await asyncio.sleep(POLL_S)
    return seen


async def _new_events(db: asyncpg.Connection, history_end: int) -> dict[str, int]:
    return {row[0]: row[1] for row in await db.fetch(NEW_EVENTS, history_end)}


class LogLine(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of the control plane's log lines that this benchmark reads."""

    event: str
    timestamp: str
    events: list[str] | int = []
    """Types recorded ("fleet_events_recorded"), or how many ("reconcile_pass")."""
    duration_ms: float = 0.0
    event_types: dict[str, int] = {}


def read_server_log(log: Path, size: int, spawned_at: datetime, agents: int) -> ServerLog:
    hellos: list[float] = []
    recorded: list[float] = []
    passes: list[Pass] = []
    with log.open("rb") as file:
        text = file.read(size).decode(errors="replace")
    for entry in _json_entries(text):
        try:
            line = msgspec.convert(entry, LogLine)
        except msgspec.ValidationError:
            continue
        at = (datetime.fromisoformat(line.timestamp) - spawned_at).total_seconds()
        if line.event == "agent_connected":
            hellos.append(at)
        elif line.event == "fleet_events_recorded" and _names(line.events, "node_connected"):
            recorded.append(at)
        elif line.event == "reconcile_pass":
            passes.append(Pass(round(at, 2), round(line.duration_ms / 1000, 2), line.event_types))
    return ServerLog(
        hellos_s=_nth(hellos, agents),
        first_recorded_s=_nth(recorded, 1),
        last_recorded_s=_nth(recorded, agents),
        passes=passes,
    )


def _names(events: list[str] | int, name: str) -> bool:
    return isinstance(events, list) and name in events


def _nth(times: list[float], n: int) -> float | None:
    return round(sorted(times)[n - 1], 2) if len(times) >= n else None


def _json_entries(text: str) -> Iterator[dict[str, object]]:
    """structlog's JSON objects; the standard library's lines share the stream and are
    sometimes written into the middle of one, so every ``{`` is tried."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            entry, end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(entry, dict):
            yield entry
        start = text.find("{", end)


# -- report -----------------------------------------------------------------------------------


class Results(msgspec.Struct, frozen=True, kw_only=True):
    agents: int
    replicas: int
    adoption_grace_s: float
    settle_s: float
    machine: Machine
    runs: list[Run]
    target_adopted_s: float
    target_met: bool
    profiled: bool
    """py-spy ran beside the control plane, taking CPU of its own."""


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(median(known), 2) if len(known) == len(values) and known else None


def _recorded_per_s(run: Run, agents: int) -> float | None:
    first, last = run.server_log.first_recorded_s, run.server_log.last_recorded_s
    if first is None or last is None or last <= first:
        return None
    return round(agents / (last - first), 1)


def report(results: Results) -> str:
    runs = results.runs

    def row(name: str, values: list[float | None], target: str = "-") -> list[str]:
        return [name, _seconds(_median(values)), *map(_seconds, values), target]

    def count(name: str, kind: str) -> list[str]:
        values: list[float | None] = [float(r.events_after_settle.get(kind, 0)) for r in runs]
        return [name, f"{_median(values):g}", *(f"{v:g}" for v in values), "0"]

    rows = [
        row("elected (s from spawn)", [r.elected_s for r in runs]),
        row("all connected (s from spawn)", [r.all_connected_s for r in runs]),
        row("all adopted (s from spawn)", [r.all_adopted_s for r in runs],
            f"<= {TARGET_ADOPTED_S:g}"),
        row("all connected (s from election)", [r.after_election(r.all_connected_s) for r in runs]),
        row("all adopted (s from election)", [r.after_election(r.all_adopted_s) for r in runs]),
        count("replica_placed after restart", "replica_placed"),
        count("stray_stopped after restart", "stray_stopped"),
        row("server CPU, mean (cores)", [r.cpu_cores_mean for r in runs]),
        row("server CPU, peak second (cores)",
            [max((s.cpu_cores for s in r.cpu_samples), default=0.0) for r in runs]),
        row("agents' process CPU, mean (cores)", [r.agents_cpu_cores_mean for r in runs]),
        row("server RSS, peak (MiB)", [r.rss_peak_mib for r in runs]),
        row("every hello at the hub (s from spawn)", [r.server_log.hellos_s for r in runs]),
        row("hellos recorded per second", [_recorded_per_s(r, results.agents) for r in runs]),
        row("events a second at the leader, mean",
            [r.event_rate.per_s if r.event_rate else None for r in runs]),
        row("events a second at the leader, busiest second",
            [r.event_rate.peak_per_s if r.event_rate else None for r in runs]),
        row("longest reconcile pass (s)",
            [max((p.duration_s for p in r.server_log.passes), default=0.0) for r in runs]),
        row("load average (1 min) at spawn", [r.load_average[0] for r in runs]),
    ]  # fmt: skip
    headers = ["measure", "median", *(f"run {i + 1}" for i in range(len(runs))), "target"]
    lines = [
        f"{results.agents} agents, {results.replicas} replicas, "
        f"adoption grace {results.adoption_grace_s:g} s",
        format_table(headers, rows),
    ]
    for index, run in enumerate(runs, 1):
        lines.append(f"run {index}: events after the restart {run.events_after_settle}")
        for done in run.server_log.passes:
            lines.append(
                f"  pass ended at {done.ended_s:.2f} s, took {done.duration_s:.2f} s: {done.events}"
            )
    lines.append(f"target met: {results.target_met}")
    return "\n".join(lines)


async def run_all(arguments: argparse.Namespace, workdir: Path) -> Results:
    certificates = certificates_for(workdir / "certificates", arguments.agents)
    runs: list[Run] = []
    with bench_server() as bench:
        for index in range(arguments.runs):
            async with fresh_database(bench, "llmgw_adoption") as url:
                if index == 0:
                    machine = await describe_machine(url)
                run = await measure(url, certificates, arguments, workdir / f"server-{index}.log")
                print(
                    f"run {index + 1}: adopted {run.adopted}/{arguments.replicas} "
                    f"at {_seconds(run.all_adopted_s)} s, events {run.events_after_settle}",
                    flush=True,
                )
                runs.append(run)
    met = all(
        r.all_adopted_s is not None
        and r.all_adopted_s <= TARGET_ADOPTED_S
        and not r.events_after_settle.get("replica_placed")
        and not r.events_after_settle.get("stray_stopped")
        for r in runs
    )
    return Results(
        agents=arguments.agents,
        replicas=arguments.replicas,
        adoption_grace_s=ADOPTION_GRACE_S,
        settle_s=arguments.settle,
        machine=machine,
        runs=runs,
        target_adopted_s=TARGET_ADOPTED_S,
        target_met=met,
        profiled=arguments.profile,
    )


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds watched after")
    parser.add_argument("--workdir", type=Path, help="kept: certificates, server logs")
    parser.add_argument("--profile", action="store_true", help="py-spy of the control plane")
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=HEARTBEAT_INTERVAL_S,
        help=f"the server's heartbeat interval ({HEARTBEAT_INTERVAL_S:g}; its default is 5)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=RUN_TIMEOUT_S,
        help=f"seconds from the spawn given to adopt every replica ({RUN_TIMEOUT_S:g})",
    )
    parser.add_argument("--load-port", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    arguments = parse_arguments(argv)
    if arguments.load_port is not None:
        certificates = certificates_for(arguments.workdir, arguments.agents)
        run = run_agents(arguments.load_port, certificates, arguments.agents, arguments.replicas)
        asyncio.run(run)
        return 0
    with contextlib.ExitStack() as stack:
        workdir = arguments.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        results = asyncio.run(run_all(arguments, workdir))
    print(report(results))
    print(f"load average now: {load_average()}")
    print(f"results: {write_results('adoption', results)}")
    return 0 if results.target_met else 1


if __name__ == "__main__":
    sys.exit(main())
