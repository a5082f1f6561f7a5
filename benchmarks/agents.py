"""Agent hub benchmark: how many agents one control plane holds.

    python benchmarks/agents.py [--agents 100 1000] [--hold 20] [--runs 1]
        [--heartbeat-interval 1] [--dial-spread 0] [--open-timeout 10] [--workdir DIR]
        [--profile] [--compression deflate|none] [--server-command CMD]
    python benchmarks/agents.py --agents 3000 5000 --hold 10 --heartbeat-interval 5
    python benchmarks/agents.py --agents 5000 --hold 10 --heartbeat-interval 5 --dial-spread 30

(The second and the third: the fleets ``docs/scaling.md`` speaks of, at the default heartbeat
interval.)

For each size N and run: a fresh migrated database on one server (see
``benchmarks/common.py``), ``llmgw-server serve`` as a child process (the control plane
under test: heartbeat interval ``--heartbeat-interval``, 1 s unless told, agents over mTLS
on 127.0.0.1), and a second child process, the load process, which runs N simulated agents
on one asyncio loop: real websockets clients, each with a node certificate of its own,
sending a ``hello`` with 8 GPUs and no shards and then a ``heartbeat`` every interval,
answering nothing else. They all dial at once, as a fleet does when its control plane
comes back; with ``--dial-spread S`` each agent's first dial waits a random time of up to
S seconds instead, as a fleet's does once its agents' jittered backoff has spread them.
An agent gives TCP, TLS and the opening handshake ``--open-timeout`` seconds (10, the real
agent's) before it gives up and dials again.

1. Registration: from the load process's first dial until ``SELECT count(*) FROM nodes
   WHERE connected`` reaches N (polled every 50 ms; given up after 120 s, or
   ``--registration-timeout``).
2. Holding: for ``--hold`` seconds while every agent heartbeats, the control plane's CPU
   (utime + stime from ``/proc/<pid>/stat``, in cores) and RSS (``VmRSS``), sampled every
   second, and the heartbeat acknowledgements the load process receives per second, with
   their round trips. From them: the control plane's CPU per 1,000 agents (CPU seconds a
   second at this interval) and per heartbeat (milliseconds of CPU for one heartbeat and
   its ack, whatever the interval).

Throughout, the load process counts the times an agent heard nothing from the server for
longer than the real agent tolerates (3 heartbeat intervals; the simulated agents do not
hang up then, so that one stall does not turn into a reconnection storm), and reports its
own CPU and event loop lag, to show whether it, rather than the control plane, is the
bottleneck.

The certificates (a CA, a server certificate for 127.0.0.1, one node certificate per agent)
are issued once for the largest N and reused; issuing them is reported, not counted. With
``--workdir`` they are kept for later invocations, with the control plane's logs and, with
``--profile``, py-spy's collapsed stacks of the control plane during each phase (py-spy
takes CPU of its own: profiled runs are not comparable with the others).

Results are printed and written to ``benchmarks/results/agents-<timestamp>.json``;
``docs/performance.md`` discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

# Run as a script, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from app.pki.builders import build_ca, issue_node, issue_server
from app.pki.files import write_ca, write_issued
from app.pki.keys import generate_key
from app.pki.tls import client_ssl_context
from benchmarks.common import (
    BenchServer,
    Machine,
    bench_server,
    describe_machine,
    format_table,
    fresh_database,
    load_average,
    median,
    percentile,
    runtime_url,
    stop_on_sigterm,
    write_results,
)
from wire.errors import FleetError
from wire.messages import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    CloseCode,
    GpuReport,
    Heartbeat,
    HeartbeatAck,
    Hello,
    Welcome,
    decode_from_server,
    encode,
)

HEARTBEAT_INTERVAL_S = 1.0
TARGET_REGISTRATION_S = 10.0
TARGET_REGISTRATION_AGENTS = 1_000
TARGET_CPU_CORES = 0.5
POLL_S = 0.05
SETTLE_INTERVALS = 2
"""Heartbeat intervals between registration and holding: the last agents to be welcomed
send their first heartbeat one interval after their welcome."""
SERVER_START_TIMEOUT_S = 60.0
SERVER_STOP_TIMEOUT_S = 60.0
LOAD_MESSAGE_TIMEOUT_S = 120.0
LOAD_MESSAGE_MAX_BYTES = 64 * 2**20
"""A window's report carries every round trip it measured: 20,000 a second at 1,000 agents."""
REGISTRATION_TIMEOUT_S = 120.0
OPEN_TIMEOUT_S = 10.0
"""The real agent's before it split its timeouts: TCP, TLS and the opening handshake together
(the agent now gives TCP ``--connect-timeout``, 5 s, and what follows ``--open-timeout``,
30 s)."""
WELCOME_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
SILENT_SERVER_INTERVALS = 3
"""The real agent hangs up when the server says nothing for this many heartbeat intervals."""
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0
LOOP_PROBE_S = 0.1
GPUS_PER_NODE = 8
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_MEMORY_MIB = 81_559
CERTIFICATE_DAYS = 30
ISSUED = "issued.json"
DEFLATE, NO_COMPRESSION = "deflate", "none"
_JSON = json.JSONDecoder()
_NUMBERS = re.compile(r"\d+(\.\d+)?")
SCRIPT = Path(__file__).resolve()
BIN = Path(sys.executable).parent
SERVER_COMMAND = str(BIN / "llmgw-server")
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def node_id(number: int) -> str:
    return f"bench-{number:05d}"


# -- certificates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    directory: Path
    agents: int
    seconds: float

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def server(self) -> tuple[Path, Path]:
        return self.directory / "server.crt", self.directory / "server.key"

    def node(self, number: int) -> tuple[Path, Path]:
        stem = self.directory / "nodes" / node_id(number)
        return stem.with_suffix(".crt"), stem.with_suffix(".key")


class IssuedCertificates(msgspec.Struct, frozen=True):
    agents: int
    seconds: float
    not_after: datetime


def certificates_for(directory: Path, agents: int) -> Certificates:
    """The certificates in ``directory`` if they were issued there for at least ``agents``
    agents and stay valid for another day; otherwise newly issued ones."""
    try:
        issued = msgspec.json.decode((directory / ISSUED).read_bytes(), type=IssuedCertificates)
    except (OSError, msgspec.DecodeError):
        return issue_certificates(directory, agents)
    if issued.agents < agents or issued.not_after < datetime.now(UTC) + timedelta(days=1):
        return issue_certificates(directory, agents)
    return Certificates(directory, issued.agents, issued.seconds)


def issue_certificates(directory: Path, agents: int) -> Certificates:
    """A CA, a server certificate for 127.0.0.1 and a node certificate per agent."""
    started = time.perf_counter()
    now = datetime.now(UTC)
    ca = build_ca(generate_key(), "llmgw benchmark CA", now, days=CERTIFICATE_DAYS)
    write_ca(directory, ca, force=True)
    server_key = generate_key()
    loopback = [ipaddress.IPv4Address("127.0.0.1")]
    server = issue_server(ca, server_key, ["localhost"], loopback, now, CERTIFICATE_DAYS)
    write_issued(directory, "server", server, server_key, force=True)
    for number in range(agents):
        key = generate_key()
        certificate = issue_node(ca, key, node_id(number), now, CERTIFICATE_DAYS)
        write_issued(directory / "nodes", node_id(number), certificate, key, force=True)
    seconds = round(time.perf_counter() - started, 2)
    not_after = now + timedelta(days=CERTIFICATE_DAYS)
    issued = IssuedCertificates(agents, seconds, not_after)
    (directory / ISSUED).write_bytes(msgspec.json.encode(issued))
    return Certificates(directory, agents, seconds)


# -- the control plane under test --------------------------------------------------------------


@dataclass(frozen=True)
class ControlPlane:
    pid: int
    agent_port: int
    log: Path
    exit_code: Callable[[], int | None] = lambda: None
    """The process's exit status once it has exited (a deposed leader exits with 3)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def control_plane(
    command: Sequence[str],
    database_url: str,
    certificates: Certificates,
    log: Path,
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
) -> AsyncIterator[ControlPlane]:
    """``llmgw-server serve`` (``command``, then ``serve`` and its options) in a child
    process, once its agent hub listens; stopped with SIGTERM on exit."""
    agent_port, admin_port = free_port(), free_port()
    cert, key = certificates.server()
    arguments = [
        "serve", "--agent-host", "127.0.0.1", "--agent-port", str(agent_port),
        "--admin-host", "127.0.0.1", "--admin-port", str(admin_port),
        "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(certificates.ca),
        "--heartbeat-interval", str(heartbeat_interval_s), "--no-gateway",
        "--engine-networks", "127.0.0.0/8",
    ]  # fmt: skip
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *command,
            *arguments,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            # As the runtime role, as in production; not on the command line: a password.
            env={**os.environ, "LLMGW_DATABASE_URL": runtime_url(database_url)},
        )
    try:
        await _wait_ready(process, admin_port, agent_port, log)
        yield ControlPlane(process.pid, agent_port, log, lambda: process.returncode)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), SERVER_STOP_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()


async def _wait_ready(
    process: asyncio.subprocess.Process, admin_port: int, agent_port: int, log: Path
) -> None:
    """Until the admin API answers and the agent hub listens (once this server leads)."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(f"llmgw-server exited ({process.returncode}):\n{_tail(log)}")
        if await _answers_healthz(admin_port) and await _accepts(agent_port):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"llmgw-server did not start its agent hub in time:\n{_tail(log)}")


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


async def _answers_healthz(port: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    try:
        writer.write(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        status = await reader.readline()
        return status.split(b" ")[1:2] == [b"200"]
    except OSError:
        return False
    finally:
        writer.close()


def _tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def server_log_summary(log: Path, size: int) -> dict[str, int]:
    """What the control plane logged in the first ``size`` bytes of ``log``, counted by level
    and message: structlog's JSON lines and the standard library's ``LEVEL - time - logger -
    ... - message`` lines."""
    counts: Counter[str] = Counter()
    with log.open("rb") as file:
        text = file.read(size).decode(errors="replace")
    for line in text.splitlines():
        for level, message in _log_entries(line):
            counts[f"{level.lower()}: {message[:100]}"] += 1
    return dict(counts.most_common())


def _log_entries(line: str) -> Iterator[tuple[str, str]]:
    # Both kinds share stderr, and a line of one kind is sometimes written into the middle
    # of a line of the other.
    while line:
        if line.startswith("{"):
            try:
                entry, end = _JSON.raw_decode(line)
            except ValueError:
                yield "unparsed", line
                return
            message = str(entry.get("event"))
            if "code" in entry:  # a close: which code, and why (numbers left out)
                reason = _NUMBERS.sub("#", str(entry.get("reason")))
                message = f"{message} {entry['code']} {reason}"
            yield str(entry.get("level")), message
            line = line[end:]
        else:
            text, brace, rest = line.partition('{"')
            fields = text.split(" - ")
            yield (fields[0], fields[-1]) if len(fields) > 1 else ("unparsed", text)
            line = brace + rest


@contextlib.asynccontextmanager
async def profiled(pid: int, output: Path | None) -> AsyncIterator[None]:
    """``py-spy record`` of ``pid`` (collapsed stacks of the threads on CPU) for as long as
    the block runs; nothing when ``output`` is None."""
    if output is None:
        yield
        return
    py_spy = shutil.which("py-spy", path=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    if py_spy is None:
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    process = await asyncio.create_subprocess_exec(
        py_spy, "record", "--pid", str(pid), "--format", "raw", "--output", str(output),
        "--rate", "100", "--nonblocking",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        await process.wait()


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name may hold spaces; the fields after it start at state (field 3).
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def listen_overflows() -> int:
    """Connections the kernel dropped because a listen queue was full (this network
    namespace, every listener: whatever else runs here counts too)."""
    lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines()]
    for header, values in itertools.pairwise(lines):
        if header[0] == "TcpExt:" and values[0] == "TcpExt:":
            return int(dict(zip(header, values, strict=True))["ListenOverflows"])
    return 0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"process {pid} reports no VmRSS")


# -- the load processes: simulated agents, one asyncio loop each --------------------------------


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    contexts_seconds: float


class Dialling(msgspec.Struct, frozen=True, tag="dialling"):
    at: float
    """``time.monotonic()`` of the first dial: one clock for every process on Linux."""


class Welcomes(msgspec.Struct, frozen=True, tag="welcomes", kw_only=True):
    """One load process's view of registration, when asked (``status``)."""

    cpu_seconds: float
    first_welcomes: list[float]
    """When each agent that has been welcomed was welcomed the first time (monotonic)."""
    disconnects: int
    dial_failures: dict[str, int]
    server_silences: int
    loop_lag_max_s: float


class Window(msgspec.Struct, frozen=True, tag="window", kw_only=True):
    """What one load process saw while measuring (``measure`` until ``stop``)."""

    seconds: float
    cpu_seconds: float
    heartbeats: int
    acks: int
    unacknowledged: int
    server_silences: int
    disconnects: int
    round_trips: list[float]
    lateness: list[float]
    loop_lag: list[float]


LoadMessage = Ready | Dialling | Welcomes | Window
M = TypeVar("M", Ready, Dialling, Welcomes, Window)


class AgentStats:
    """What every simulated agent adds to; window figures count only while measuring."""

    def __init__(self) -> None:
        self.first_welcome: dict[str, float] = {}
        self.dial_failures: Counter[str] = Counter()
        self.disconnects = 0
        self.silences = 0
        self.measuring = False
        self.window_started = 0.0
        self.heartbeats = 0
        self.acks = 0
        self.acks_of_window = 0
        self.window_silences = 0
        self.window_disconnects = 0
        self.round_trips: list[float] = []
        self.lateness: list[float] = []
        self.loop_lag: list[float] = []

    def start_window(self) -> None:
        self.heartbeats = self.acks = self.acks_of_window = 0
        self.window_silences = self.window_disconnects = 0
        self.round_trips, self.lateness, self.loop_lag = [], [], []
        self.window_started = time.monotonic()
        self.measuring = True

    def welcome(self, node: str) -> None:
        self.first_welcome.setdefault(node, time.monotonic())

    def disconnected(self) -> None:
        self.disconnects += 1
        if self.measuring:
            self.window_disconnects += 1

    def silence(self) -> None:
        self.silences += 1
        if self.measuring:
            self.window_silences += 1


class SimulatedAgent:
    """One node's agent, reduced to the channel: hello, then a heartbeat every interval;
    it dials again after a failure, like the real agent, with a jittered growing delay."""

    def __init__(
        self,
        number: int,
        context: ssl.SSLContext,
        uri: str,
        stats: AgentStats,
        compression: str | None,
        open_timeout_s: float = OPEN_TIMEOUT_S,
    ) -> None:
        self.node_id = node_id(number)
        self._open_timeout_s = open_timeout_s
        self._compression = compression
        self._websocket: ClientConnection | None = None
        self._stopping = False
        self._hello = encode(_hello(number))
        # Dialled from the address it advertises, as a real node is: the hub accepts an
        # engine address that the connection comes from (or the certificate names).
        self._source = (node_address(number), 0)
        self._context = context
        self._uri = uri
        self._stats = stats
        self._sent: dict[int, float] = {}
        self._heard_at = 0.0
        self._silence_limit = float("inf")

    async def run(self, first_dial_after_s: float = 0.0) -> None:
        await asyncio.sleep(first_dial_after_s)
        delay = RETRY_FIRST_S
        while not self._stopping:
            try:
                async with connect(
                    self._uri,
                    ssl=self._context,
                    max_size=MAX_MESSAGE_BYTES,
                    open_timeout=self._open_timeout_s,
                    close_timeout=CLOSE_TIMEOUT_S,
                    compression=self._compression,
                    proxy=None,
                    local_addr=self._source,
                ) as websocket:
                    delay = RETRY_FIRST_S
                    self._websocket = websocket
                    await self._converse(websocket)
            except ConnectionClosed:
                self._stats.disconnected()
            except (OSError, TimeoutError, WebSocketException, FleetError) as exc:
                self._stats.dial_failures[type(exc).__name__] += 1
            finally:
                self._websocket = None
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, RETRY_MAX_S)

    async def stop(self) -> None:
        """Close the connection as an agent that shuts down does, and dial no more."""
        self._stopping = True
        if self._websocket is not None:
            await self._websocket.close(CloseCode.GOING_AWAY, "agent stopping")

    async def _converse(self, websocket: ClientConnection) -> None:
        await websocket.send(self._hello, text=True)
        async with asyncio.timeout(WELCOME_TIMEOUT_S):
            welcome = decode_from_server(await websocket.recv())
        if not isinstance(welcome, Welcome):
            raise WebSocketException(f"expected welcome, got {type(welcome).__name__}")
        self._heard_at = welcomed = time.monotonic()
        self._stats.welcome(self.node_id)
        interval = welcome.heartbeat_interval_s
        self._silence_limit = SILENT_SERVER_INTERVALS * interval
        beating = asyncio.create_task(self._heartbeat(websocket, welcomed, interval))
        try:
            async for frame in websocket:
                self._heard()
                message = decode_from_server(frame)
                if isinstance(message, HeartbeatAck):
                    self._acknowledged(message.seq)
        finally:
            beating.cancel()
            self._silence_limit = float("inf")

    def _heard(self) -> None:
        now = time.monotonic()
        if now - self._heard_at > self._silence_limit:
            self._stats.silence()
        self._heard_at = now

    def silent(self, now: float) -> bool:
        """Whether the server has said nothing for longer than a real agent waits."""
        return now - self._heard_at > self._silence_limit

    async def _heartbeat(
        self, websocket: ClientConnection, welcomed: float, interval: float
    ) -> None:
        self._sent.clear()
        due = welcomed + interval
        for seq in itertools.count():
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            if self._stats.measuring:
                self._stats.lateness.append(now - due)
                self._stats.heartbeats += 1
            self._sent[seq] = now
            await websocket.send(encode(Heartbeat(seq=seq)), text=True)
            due = max(due + interval, now)  # late: one heartbeat, never a burst

    def _acknowledged(self, seq: int) -> None:
        sent = self._sent.pop(seq, None)
        if not self._stats.measuring or sent is None:
            return
        self._stats.acks += 1
        self._stats.round_trips.append(time.monotonic() - sent)
        if sent >= self._stats.window_started:
            self._stats.acks_of_window += 1


def gpu_reports(number: int) -> tuple[GpuReport, ...]:
    """The fake GPUs of simulated agent ``number`` (uuids unique across the fleet)."""
    return tuple(
        GpuReport(
            index=index,
            uuid=str(uuid.UUID(int=number * GPUS_PER_NODE + index)),
            name=GPU_NAME,
            memory_total_mib=GPU_MEMORY_MIB,
            memory_used_mib=0,
            healthy=True,
        )
        for index in range(GPUS_PER_NODE)
    )


def node_address(number: int) -> str:
    return f"127.{number // 65_536 % 256}.{number // 256 % 256}.{number % 256}"


def _hello(number: int) -> Hello:
    return Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=node_id(number),
        agent_version="benchmark",
        address=node_address(number),
        labels={"pool": "benchmark"},
        port_range=(20_000, 20_999),
        gpus=gpu_reports(number),
    )


async def _probe_loop_lag(stats: AgentStats) -> None:
    while True:
        before = time.monotonic()
        await asyncio.sleep(LOOP_PROBE_S)
        stats.loop_lag.append(time.monotonic() - before - LOOP_PROBE_S)


def _say(message: LoadMessage) -> None:
    sys.stdout.write(msgspec.json.encode(message).decode() + "\n")
    sys.stdout.flush()


async def _command() -> str:
    line: str = await asyncio.to_thread(sys.stdin.readline)
    return line.strip()


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_load(
    port: int,
    certificates: Certificates,
    numbers: range,
    compression: str | None,
    dial_spread_s: float = 0.0,
    open_timeout_s: float = OPEN_TIMEOUT_S,
) -> None:
    """A load process: builds one TLS context per agent, then obeys ``go``, ``status``,
    ``measure`` and ``stop`` on stdin, reporting on stdout."""
    started = time.perf_counter()
    contexts = [_client_context(certificates, number) for number in numbers]
    _say(Ready(contexts_seconds=round(time.perf_counter() - started, 2)))
    stats = AgentStats()
    uri = f"wss://127.0.0.1:{port}"
    agents = [
        SimulatedAgent(number, context, uri, stats, compression, open_timeout_s)
        for number, context in zip(numbers, contexts, strict=True)
    ]
    if await _command() != "go":
        return
    cpu_at_go = _own_cpu_seconds()
    _say(Dialling(at=time.monotonic()))
    tasks = [asyncio.create_task(agent.run(random.uniform(0, dial_spread_s))) for agent in agents]
    tasks.append(asyncio.create_task(_probe_loop_lag(stats)))
    if await _command() != "status":
        return
    _say(
        Welcomes(
            cpu_seconds=_own_cpu_seconds() - cpu_at_go,
            first_welcomes=list(stats.first_welcome.values()),
            disconnects=stats.disconnects,
            dial_failures=dict(stats.dial_failures),
            server_silences=stats.silences,
            loop_lag_max_s=max(stats.loop_lag, default=0.0),
        )
    )
    if await _command() != "measure":
        return
    window_started, cpu_before = time.monotonic(), _own_cpu_seconds()
    stats.start_window()
    await _command()  # stop
    stats.measuring = False
    ended = time.monotonic()
    _say(
        Window(
            seconds=ended - window_started,
            cpu_seconds=_own_cpu_seconds() - cpu_before,
            heartbeats=stats.heartbeats,
            acks=stats.acks,
            unacknowledged=stats.heartbeats - stats.acks_of_window,
            server_silences=stats.window_silences + sum(agent.silent(ended) for agent in agents),
            disconnects=stats.window_disconnects,
            round_trips=stats.round_trips,
            lateness=stats.lateness,
            loop_lag=stats.loop_lag,
        )
    )
    await asyncio.gather(*(agent.stop() for agent in agents))
    for task in tasks:
        task.cancel()  # those waiting to dial again, and the lag probe
    await asyncio.gather(*tasks, return_exceptions=True)


def _client_context(certificates: Certificates, number: int) -> ssl.SSLContext:
    cert, key = certificates.node(number)
    return client_ssl_context(certificates.ca, cert, key)


class LoadProcess:
    """The parent's handle on one load process."""

    _decoder = msgspec.json.Decoder(LoadMessage)

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @classmethod
    async def start(
        cls,
        port: int,
        certificates: Certificates,
        numbers: range,
        compression: str | None,
        dial_spread_s: float = 0.0,
        open_timeout_s: float = OPEN_TIMEOUT_S,
    ) -> LoadProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(SCRIPT), "--load-port", str(port),
            "--load-certificates", str(certificates.directory),
            "--load-numbers", str(numbers.start), str(numbers.stop),
            "--compression", compression or NO_COMPRESSION,
            "--dial-spread", str(dial_spread_s),
            "--open-timeout", str(open_timeout_s),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=LOAD_MESSAGE_MAX_BYTES,
        )  # fmt: skip
        return cls(process)

    async def expect(self, kind: type[M]) -> M:
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), LOAD_MESSAGE_TIMEOUT_S)
        if not line:
            raise RuntimeError(f"a load process exited ({await self._process.wait()})")
        message = self._decoder.decode(line)
        if not isinstance(message, kind):
            raise RuntimeError(f"a load process said {message!r}, not {kind.__name__}")
        return message

    async def tell(self, command: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(f"{command}\n".encode())
        await self._process.stdin.drain()

    async def close(self) -> None:
        if self._process.returncode is None:
            with contextlib.suppress(ConnectionError):
                await self.tell("stop")
            try:
                await asyncio.wait_for(self._process.wait(), CLOSE_TIMEOUT_S * 5)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()


class LoadFleet:
    """The agents, split evenly over one or more load processes, driven as one."""

    def __init__(self, processes: list[LoadProcess]) -> None:
        self._processes = processes

    @classmethod
    @contextlib.asynccontextmanager
    async def started(
        cls,
        port: int,
        certificates: Certificates,
        processes: int,
        compression: str | None,
        dial_spread_s: float = 0.0,
        open_timeout_s: float = OPEN_TIMEOUT_S,
    ) -> AsyncIterator[LoadFleet]:
        bounds = [certificates.agents * index // processes for index in range(processes + 1)]
        fleet = cls([])
        try:
            for start, stop in itertools.pairwise(bounds):
                numbers = range(start, stop)
                fleet._processes.append(
                    await LoadProcess.start(
                        port, certificates, numbers, compression, dial_spread_s, open_timeout_s
                    )
                )
            yield fleet
        finally:
            await asyncio.gather(*(process.close() for process in fleet._processes))

    async def tell(self, command: str) -> None:
        await asyncio.gather(*(process.tell(command) for process in self._processes))

    async def expect(self, kind: type[M]) -> list[M]:
        return list(await asyncio.gather(*(process.expect(kind) for process in self._processes)))


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the agents saw while holding, all load processes together."""

    seconds: float
    heartbeats: int
    acks: int
    acks_per_s: float
    heartbeats_per_s: float
    unacknowledged: int
    """Heartbeats sent in the window with no acknowledgement by its end."""
    server_silences: int
    """Times an agent heard nothing from the server for longer than the real agent waits
    before it hangs up (``SILENT_SERVER_INTERVALS`` heartbeat intervals)."""
    round_trip_p50_ms: float
    round_trip_p99_ms: float
    round_trip_max_ms: float
    heartbeat_lateness_p99_ms: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    cpu_cores: float
    """Of the load processes together."""
    disconnects: int

    @classmethod
    def of(cls, windows: Sequence[Window]) -> LoadReport:
        seconds = max(window.seconds for window in windows)
        round_trips = [value for window in windows for value in window.round_trips]
        lateness = [value for window in windows for value in window.lateness]
        loop_lag = [value for window in windows for value in window.loop_lag]
        heartbeats = sum(window.heartbeats for window in windows)
        acks = sum(window.acks for window in windows)
        return cls(
            seconds=round(seconds, 3),
            heartbeats=heartbeats,
            acks=acks,
            acks_per_s=round(acks / seconds, 1),
            heartbeats_per_s=round(heartbeats / seconds, 1),
            unacknowledged=sum(window.unacknowledged for window in windows),
            server_silences=sum(window.server_silences for window in windows),
            round_trip_p50_ms=_ms(round_trips, 50),
            round_trip_p99_ms=_ms(round_trips, 99),
            round_trip_max_ms=_ms(round_trips, 100),
            heartbeat_lateness_p99_ms=_ms(lateness, 99),
            loop_lag_p99_ms=_ms(loop_lag, 99),
            loop_lag_max_ms=_ms(loop_lag, 100),
            cpu_cores=round(sum(window.cpu_seconds for window in windows) / seconds, 3),
            disconnects=sum(window.disconnects for window in windows),
        )


def _ms(seconds: Sequence[float], pct: float) -> float:
    return round(percentile(seconds, pct) * 1000, 2) if seconds else 0.0


# -- one run -----------------------------------------------------------------------------------


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    complete: bool
    connected: int
    """Nodes connected in the ``nodes`` table at the end (all, unless it timed out)."""
    seconds: float
    """First dial until every node is connected in the ``nodes`` table, or until
    ``REGISTRATION_TIMEOUT_S`` when they were not."""
    welcomed: int
    welcomed_seconds: float | None
    """First dial until the load process held a welcome for every agent (None: some had
    none)."""
    server_cpu_seconds: float
    load_cpu_seconds: float
    events: int
    connected_by_second: list[int]
    welcomed_by_second: list[int]
    disconnects: int
    """Connections that ended before every agent was welcomed (each agent dials again)."""
    dial_failures: dict[str, int]
    server_silences: int
    load_loop_lag_max_ms: float
    listen_overflows: int
    """Connection attempts the kernel dropped meanwhile because a listen queue was full
    (they are retried by TCP, a second or more later)."""


class Sample(msgspec.Struct, frozen=True):
    at_s: float
    cpu_cores: float
    rss_mib: float


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    seconds: float
    cpu_cores_median: float
    cpu_cores_max: float
    cpu_cores_mean: float
    rss_mib_median: float
    rss_mib_max: float
    events_appended: int
    samples: list[Sample]
    load: LoadReport


class Run(msgspec.Struct, frozen=True, kw_only=True):
    agents: int
    number: int
    profiled: bool
    """py-spy sampled the control plane: its figures are not comparable with other runs."""
    idle_rss_mib: float
    load_processes: int
    load_contexts_seconds: float
    registration: Registration
    hold: Hold
    load_average: dict[str, tuple[float, float, float]]
    server_log: dict[str, int]
    """What the control plane logged until the end of the holding window."""


@dataclass(frozen=True)
class Options:
    hold_s: int
    workdir: Path
    profile: bool
    compression: str | None
    server_command: tuple[str, ...]
    load_processes: int
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    registration_timeout_s: float = REGISTRATION_TIMEOUT_S
    dial_spread_s: float = 0.0
    open_timeout_s: float = OPEN_TIMEOUT_S

    def output(self, agents: int, number: int, what: str) -> Path:
        return self.workdir / f"{what}-{agents}-{number}.txt"

    def profile_output(self, agents: int, number: int, phase: str) -> Path | None:
        return self.output(agents, number, f"profile-{phase}") if self.profile else None


async def measure(
    server: BenchServer, certificates: Certificates, options: Options, number: int
) -> Run:
    loads = {"start": load_average()}
    agents = certificates.agents
    log = options.output(agents, number, "server-log")
    async with fresh_database(server) as url:
        db = await asyncpg.connect(url)
        try:
            async with control_plane(
                options.server_command, url, certificates, log, options.heartbeat_interval_s
            ) as plane:
                idle_rss = rss_mib(plane.pid)
                async with LoadFleet.started(
                    plane.agent_port,
                    certificates,
                    options.load_processes,
                    options.compression,
                    options.dial_spread_s,
                    options.open_timeout_s,
                ) as load:
                    ready = await load.expect(Ready)
                    async with profiled(
                        plane.pid, options.profile_output(agents, number, "registration")
                    ):
                        registration = await _register(
                            db, plane, load, agents, options.registration_timeout_s
                        )
                    loads["registered"] = load_average()
                    await asyncio.sleep(SETTLE_INTERVALS * options.heartbeat_interval_s)
                    async with profiled(plane.pid, options.profile_output(agents, number, "hold")):
                        hold = await _hold(db, plane, load, options.hold_s)
                    loads["held"] = load_average()
                    measured_log = log.stat().st_size  # not the agents' goodbyes
        finally:
            await db.close()
    return Run(
        agents=agents,
        number=number,
        profiled=options.profile,
        idle_rss_mib=idle_rss,
        load_processes=options.load_processes,
        load_contexts_seconds=max(process.contexts_seconds for process in ready),
        registration=registration,
        hold=hold,
        load_average=loads,
        server_log=server_log_summary(log, measured_log),
    )


async def _register(
    db: asyncpg.Connection,
    plane: ControlPlane,
    load: LoadFleet,
    agents: int,
    timeout_s: float = REGISTRATION_TIMEOUT_S,
) -> Registration:
    cpu_before, overflows_before = cpu_seconds(plane.pid), listen_overflows()
    await load.tell("go")
    dialled_at = min(dialling.at for dialling in await load.expect(Dialling))
    deadline = dialled_at + timeout_s
    polls: list[tuple[float, int]] = []
    while (connected := await _connected_nodes(db)) < agents and time.monotonic() < deadline:
        if (code := plane.exit_code()) is not None:
            raise RuntimeError(
                f"the control plane exited ({code}) with {connected} of {agents} agents "
                f"registered, {time.monotonic() - dialled_at:.0f} s after the first dial:\n"
                f"{_tail(plane.log)}"
            )
        polls.append((time.monotonic(), connected))
        await asyncio.sleep(POLL_S)
    registered_at = time.monotonic()
    polls.append((registered_at, connected))
    server_cpu = cpu_seconds(plane.pid) - cpu_before
    await load.tell("status")
    statuses = await load.expect(Welcomes)
    welcomes = [at for status in statuses for at in status.first_welcomes]
    failures: Counter[str] = Counter()
    for status in statuses:
        failures.update(status.dial_failures)
    return Registration(
        complete=connected == agents,
        connected=connected,
        seconds=round(registered_at - dialled_at, 2),
        welcomed=len(welcomes),
        welcomed_seconds=round(max(welcomes) - dialled_at, 2) if len(welcomes) == agents else None,
        server_cpu_seconds=round(server_cpu, 2),
        load_cpu_seconds=round(sum(status.cpu_seconds for status in statuses), 2),
        events=await _events(db),
        connected_by_second=_connected_by_second(polls, dialled_at),
        welcomed_by_second=by_second(welcomes, dialled_at),
        disconnects=sum(status.disconnects for status in statuses),
        dial_failures=dict(failures),
        server_silences=sum(status.server_silences for status in statuses),
        load_loop_lag_max_ms=round(max(status.loop_lag_max_s for status in statuses) * 1000, 1),
        listen_overflows=listen_overflows() - overflows_before,
    )


def _connected_by_second(polls: Sequence[tuple[float, int]], start: float) -> list[int]:
    """The connected count the last poll in each second after ``start`` saw."""
    counts: list[int] = []
    for at, connected in polls:
        second = int(at - start)
        counts += [counts[-1] if counts else 0] * (second + 1 - len(counts))
        counts[second] = connected
    return counts


def by_second(times: Sequence[float], start: float) -> list[int]:
    """How many of ``times`` fall before the end of each second after ``start``."""
    if not times:
        return []
    counts = Counter(int(at - start) for at in times)
    return list(itertools.accumulate(counts[second] for second in range(max(counts) + 1)))


async def _hold(db: asyncpg.Connection, plane: ControlPlane, load: LoadFleet, seconds: int) -> Hold:
    events_before = await _events(db)
    await load.tell("measure")
    samples = await _sample(plane.pid, seconds)
    await load.tell("stop")
    report = LoadReport.of(await load.expect(Window))
    cores = [sample.cpu_cores for sample in samples]
    rss = [sample.rss_mib for sample in samples]
    return Hold(
        seconds=round(samples[-1].at_s, 2),
        cpu_cores_median=round(median(cores), 3),
        cpu_cores_max=round(max(cores), 3),
        cpu_cores_mean=round(sum(cores) / len(cores), 3),
        rss_mib_median=median(rss),
        rss_mib_max=max(rss),
        events_appended=await _events(db) - events_before,
        samples=samples,
        load=report,
    )


async def _sample(pid: int, seconds: int) -> list[Sample]:
    """The process's CPU over each second and its RSS at the end of it."""
    started = previous_at = time.monotonic()
    previous_cpu = cpu_seconds(pid)
    samples = []
    for second in range(1, seconds + 1):
        await asyncio.sleep(max(0.0, started + second - time.monotonic()))
        now, cpu = time.monotonic(), cpu_seconds(pid)
        cores = (cpu - previous_cpu) / (now - previous_at)
        samples.append(Sample(round(now - started, 3), round(cores, 3), rss_mib(pid)))
        previous_at, previous_cpu = now, cpu
    return samples


async def _connected_nodes(db: asyncpg.Connection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM nodes WHERE connected")
    return count


async def _events(db: asyncpg.Connection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM events")
    return count


# -- summary and report ------------------------------------------------------------------------


class SizeSummary(msgspec.Struct, frozen=True, kw_only=True):
    """Medians over the runs of one size (of the per-run maxima and counts, too)."""

    agents: int
    runs: int
    registration_s: float
    incomplete_registrations: int
    """Runs in which not every node was connected within ``REGISTRATION_TIMEOUT_S``; their
    registration counts as that long."""
    welcomed_s: float | None
    registration_server_cpu_s: float
    registration_dial_failures: float
    registration_disconnects: float
    registration_server_silences: float
    registration_listen_overflows: float
    registration_load_loop_lag_max_ms: float
    idle_rss_mib: float
    cpu_cores_median: float
    cpu_cores_max: float
    rss_mib_median: float
    rss_mib_max: float
    heartbeats_per_s: float
    acks_per_s: float
    unacknowledged: float
    round_trip_p50_ms: float
    round_trip_p99_ms: float
    hold_server_silences: float
    hold_disconnects: float
    hold_events_appended: float
    load_cpu_cores: float
    load_loop_lag_max_ms: float
    registration_met: bool | None
    """None below ``TARGET_REGISTRATION_AGENTS``, which the target speaks of."""
    cpu_met: bool
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    cpu_cores_per_1000_agents: float = 0.0
    """The median holding CPU scaled to 1,000 agents: CPU seconds a second at this
    heartbeat interval."""
    cpu_ms_per_heartbeat: float = 0.0
    """The median holding CPU over the acknowledgements a second: one heartbeat and its
    ack, whatever the interval."""


def cpu_per_thousand(cpu_cores: float, agents: int) -> float:
    """CPU cores for 1,000 agents, from ``cpu_cores`` measured for ``agents``."""
    return round(cpu_cores * 1_000 / agents, 3) if agents else 0.0


def cpu_ms_per_heartbeat(cpu_cores: float, acks_per_s: float) -> float:
    """Milliseconds of CPU per heartbeat and its ack, from ``cpu_cores`` spent while
    ``acks_per_s`` were acknowledged."""
    return round(cpu_cores * 1_000 / acks_per_s, 3) if acks_per_s > 0 else 0.0


def summarize(
    runs: Sequence[Run], heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
) -> SizeSummary:
    def mid(values: Sequence[float]) -> float:
        return round(median(values), 3)

    agents = runs[0].agents
    registrations = [run.registration for run in runs]
    holds = [run.hold for run in runs]
    loads = [hold.load for hold in holds]
    registration = mid([r.seconds for r in registrations])
    cpu = mid([hold.cpu_cores_median for hold in holds])
    return SizeSummary(
        agents=agents,
        runs=len(runs),
        registration_s=registration,
        incomplete_registrations=sum(not r.complete for r in registrations),
        welcomed_s=_median_known([r.welcomed_seconds for r in registrations]),
        registration_server_cpu_s=mid([r.server_cpu_seconds for r in registrations]),
        registration_dial_failures=mid([sum(r.dial_failures.values()) for r in registrations]),
        registration_disconnects=mid([r.disconnects for r in registrations]),
        registration_server_silences=mid([r.server_silences for r in registrations]),
        registration_listen_overflows=mid([r.listen_overflows for r in registrations]),
        registration_load_loop_lag_max_ms=mid([r.load_loop_lag_max_ms for r in registrations]),
        idle_rss_mib=mid([run.idle_rss_mib for run in runs]),
        cpu_cores_median=cpu,
        cpu_cores_max=mid([hold.cpu_cores_max for hold in holds]),
        rss_mib_median=mid([hold.rss_mib_median for hold in holds]),
        rss_mib_max=mid([hold.rss_mib_max for hold in holds]),
        heartbeats_per_s=mid([load.heartbeats_per_s for load in loads]),
        acks_per_s=mid([load.acks_per_s for load in loads]),
        unacknowledged=mid([load.unacknowledged for load in loads]),
        round_trip_p50_ms=mid([load.round_trip_p50_ms for load in loads]),
        round_trip_p99_ms=mid([load.round_trip_p99_ms for load in loads]),
        hold_server_silences=mid([load.server_silences for load in loads]),
        hold_disconnects=mid([load.disconnects for load in loads]),
        hold_events_appended=mid([hold.events_appended for hold in holds]),
        load_cpu_cores=mid([load.cpu_cores for load in loads]),
        load_loop_lag_max_ms=mid([load.loop_lag_max_ms for load in loads]),
        registration_met=(
            registration <= TARGET_REGISTRATION_S if agents >= TARGET_REGISTRATION_AGENTS else None
        ),
        cpu_met=cpu < TARGET_CPU_CORES,
        heartbeat_interval_s=heartbeat_interval_s,
        cpu_cores_per_1000_agents=cpu_per_thousand(cpu, agents),
        cpu_ms_per_heartbeat=cpu_ms_per_heartbeat(cpu, mid([load.acks_per_s for load in loads])),
    )


def _median_known(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return round(median(known), 3) if len(known) == len(values) else None


class Results(msgspec.Struct, frozen=True, kw_only=True):
    benchmark: str
    started_at: str
    control_plane: str
    revision: str
    arguments: dict[str, object]
    server: str
    machine: Machine
    certificates: dict[str, float]
    targets: dict[str, float]
    summary: list[SizeSummary]
    runs: list[Run]


def _registration(size: SizeSummary) -> str:
    welcomed = "-" if size.welcomed_s is None else f"{size.welcomed_s:.2f}"
    incomplete = f", {size.incomplete_registrations} incomplete"
    return (
        f"{size.registration_s:.2f} ({welcomed}"
        f"{incomplete if size.incomplete_registrations else ''})"
    )


def report(results: Results) -> str:
    machine, sizes = results.machine, results.summary
    verdict = {True: "yes", False: "NO", None: "-"}

    def row(figure: str, cell: Callable[[SizeSummary], str], target: str = "") -> list[str]:
        return [figure, *(cell(size) for size in sizes), target]

    rows = [
        row("registered s (all welcomed s)", _registration,
            f"<= {TARGET_REGISTRATION_S:.0f} at {TARGET_REGISTRATION_AGENTS:,}"),
        row("  control plane CPU s", lambda s: f"{s.registration_server_cpu_s:.2f}"),
        row("  load processes max lag ms",
            lambda s: f"{s.registration_load_loop_lag_max_ms:.0f}"),
        row("  dial failures / disconnects",
            lambda s: f"{s.registration_dial_failures:.0f} / {s.registration_disconnects:.0f}",
            "0 / 0"),
        row("  agents left silent > 3 intervals",
            lambda s: f"{s.registration_server_silences:.0f}", "0"),
        row("  listen queue overflows", lambda s: f"{s.registration_listen_overflows:.0f}", "0"),
        row("holding: heartbeats sent / acks per s",
            lambda s: f"{s.heartbeats_per_s:,.0f} / {s.acks_per_s:,.0f}", "N / N"),
        row("  heartbeats unacknowledged", lambda s: f"{s.unacknowledged:.0f}", "~0"),
        row("  ack round trip p50 / p99 ms",
            lambda s: f"{s.round_trip_p50_ms:.1f} / {s.round_trip_p99_ms:.1f}"),
        row("  agents left silent / disconnects",
            lambda s: f"{s.hold_server_silences:.0f} / {s.hold_disconnects:.0f}", "0 / 0"),
        row("  control plane CPU cores med / max",
            lambda s: f"{s.cpu_cores_median:.3f} / {s.cpu_cores_max:.3f}",
            f"< {TARGET_CPU_CORES}"),
        row("  control plane CPU cores per 1,000 agents",
            lambda s: f"{s.cpu_cores_per_1000_agents:.3f}"),
        row("  control plane CPU ms per heartbeat",
            lambda s: f"{s.cpu_ms_per_heartbeat:.3f}"),
        row("  control plane RSS MiB med / max (idle)",
            lambda s: f"{s.rss_mib_median:.0f} / {s.rss_mib_max:.0f} ({s.idle_rss_mib:.0f})"),
        row("  events appended", lambda s: f"{s.hold_events_appended:.0f}", "0"),
        row("  load processes CPU cores / max lag ms",
            lambda s: f"{s.load_cpu_cores:.2f} / {s.load_loop_lag_max_ms:.0f}"),
        row("targets met (registration / CPU)",
            lambda s: f"{verdict[s.registration_met]} / {verdict[s.cpu_met]}"),
    ]  # fmt: skip
    headers = ["agents", *(f"{size.agents:,} ({size.runs} runs)" for size in sizes), "target"]
    loads = [
        f"{run.agents} #{run.number}: "
        + "; ".join(f"{phase} {' '.join(map(str, v))}" for phase, v in run.load_average.items())
        for run in results.runs
    ]
    certificates = results.certificates
    return "\n".join(
        [
            f"{machine.cpu_model}, {machine.cores} cores, {machine.memory_gib} GiB, "
            f"Python {machine.python}, PostgreSQL {machine.postgresql} ({results.server})",
            f"control plane: {results.control_plane} at {results.revision}",
            f"certificates: {certificates['agents']:.0f} node certificates issued in "
            f"{certificates['seconds']:.2f} s (not counted)",
            "medians over the runs:",
            format_table(headers, rows),
            "load average (1/5/15 min): " + " | ".join(loads),
        ]
    )


# -- entry point -------------------------------------------------------------------------------


async def run_all(
    server: BenchServer,
    certificates: Certificates,
    sizes: Sequence[int],
    runs: int,
    options: Options,
) -> tuple[Machine, list[Run]]:
    done: list[Run] = []
    for number in range(1, runs + 1):
        for agents in sizes:
            load = " ".join(map(str, load_average()))
            print(f"{agents:,} agents, run {number} (load average {load})", flush=True)
            subset = Certificates(certificates.directory, agents, certificates.seconds)
            done.append(await measure(server, subset, options, number))
            print(f"  {_one_line(done[-1])}", flush=True)
    return await describe_machine(server.admin_url), done


def _one_line(run: Run) -> str:
    registration, hold = run.registration, run.hold
    registered = (
        f"registered in {registration.seconds:.2f} s"
        if registration.complete
        else f"only {registration.connected} registered after {registration.seconds:.0f} s"
    )
    return (
        f"{registered}; holding: CPU {hold.cpu_cores_median:.3f} cores "
        f"(max {hold.cpu_cores_max:.3f}), RSS {hold.rss_mib_median:.0f} MiB, "
        f"{hold.load.acks_per_s:,.0f} acks/s, {hold.load.server_silences} agents left silent"
    )


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, nargs="+", default=[100, 1_000])
    parser.add_argument("--hold", type=int, default=20, help="seconds of heartbeats measured")
    parser.add_argument("--runs", type=int, default=1, help="runs of every size (1)")
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=HEARTBEAT_INTERVAL_S,
        help=f"seconds between heartbeats ({HEARTBEAT_INTERVAL_S:g}; the server's default is 5)",
    )
    parser.add_argument(
        "--dial-spread",
        type=float,
        default=0.0,
        help="seconds over which the agents' first dials are spread at random (0: all at once)",
    )
    parser.add_argument(
        "--open-timeout",
        type=float,
        default=OPEN_TIMEOUT_S,
        help=f"seconds an agent gives TCP, TLS and the opening handshake before it dials "
        f"again ({OPEN_TIMEOUT_S:g}, the real agent's)",
    )
    parser.add_argument(
        "--registration-timeout",
        type=float,
        default=REGISTRATION_TIMEOUT_S,
        help=f"seconds given to register every agent ({REGISTRATION_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep certificates (reused by later runs), control plane logs and profiles here",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the control plane with py-spy (collapsed stacks in --workdir)",
    )
    parser.add_argument(
        "--compression",
        choices=(DEFLATE, NO_COMPRESSION),
        default=DEFLATE,
        help="whether the agents offer permessage-deflate, as the real agent does (deflate)",
    )
    parser.add_argument(
        "--server-command",
        default=SERVER_COMMAND,
        help="the control plane to measure, run with `serve` and its options appended "
        "(this environment's llmgw-server)",
    )
    parser.add_argument(
        "--load-processes", type=int, default=1, help="processes the agents are spread over (1)"
    )
    parser.add_argument("--load-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--load-certificates", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--load-numbers", type=int, nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def revision() -> str:
    """The commit measured, and whether the control plane's code differed from it."""
    root = SCRIPT.parents[1]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "app"], cwd=root, capture_output=True, text=True
        ).stdout.splitlines()
    except OSError:
        return "unknown"
    return f"{commit} with {len(changed)} files under app/ changed" if changed else commit


def _compression(arguments: argparse.Namespace) -> str | None:
    return None if arguments.compression == NO_COMPRESSION else DEFLATE


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    arguments = parse_arguments(argv)
    if arguments.load_port is not None:
        numbers = range(*arguments.load_numbers)
        certificates = Certificates(arguments.load_certificates, numbers.stop, 0.0)
        load = run_load(
            arguments.load_port,
            certificates,
            numbers,
            _compression(arguments),
            arguments.dial_spread,
            arguments.open_timeout,
        )
        asyncio.run(load)
        return 0
    sizes: list[int] = arguments.agents
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    measured = revision()
    with contextlib.ExitStack() as stack:
        workdir = arguments.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="llmgw-bench-agents-"))
        )
        print(f"certificates for {max(sizes):,} agents in {workdir}", flush=True)
        certificates = certificates_for(workdir, max(sizes))
        server = stack.enter_context(bench_server())
        options = Options(
            arguments.hold,
            workdir,
            arguments.profile,
            _compression(arguments),
            tuple(shlex.split(arguments.server_command)),
            arguments.load_processes,
            arguments.heartbeat_interval,
            arguments.registration_timeout,
            arguments.dial_spread,
            arguments.open_timeout,
        )
        machine, runs = asyncio.run(run_all(server, certificates, sizes, arguments.runs, options))
    results = Results(
        benchmark="agents",
        started_at=started_at,
        control_plane=arguments.server_command,
        revision=measured,
        arguments={
            "agents": sizes,
            "hold": arguments.hold,
            "runs": arguments.runs,
            "profile": arguments.profile,
            "compression": arguments.compression,
            "load_processes": arguments.load_processes,
            "heartbeat_interval": arguments.heartbeat_interval,
            "dial_spread": arguments.dial_spread,
            "open_timeout": arguments.open_timeout,
        },
        server=server.description,
        machine=machine,
        certificates={"agents": certificates.agents, "seconds": certificates.seconds},
        targets={
            "registration_s": TARGET_REGISTRATION_S,
            "registration_agents": TARGET_REGISTRATION_AGENTS,
            "cpu_cores": TARGET_CPU_CORES,
        },
        summary=[
            summarize([run for run in runs if run.agents == size], arguments.heartbeat_interval)
            for size in sizes
        ],
        runs=runs,
    )
    print(report(results))
    print(f"results: {write_results('agents', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
