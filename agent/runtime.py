"""The agent itself: its GPUs, its engines and its session with the control plane, wired.

``AgentRuntime`` holds what outlives a connection: the GPU source and its latest snapshot,
the GPU health changes no heartbeat has carried yet, what it last said of each GPU's used
memory (``agent.gpu_reports.MemoryReadings``), the engine supervisor and the command
ledger. The reconnect loop hands it each WebSocket (``serve``); it drives one
``ServerSession`` over it, carries out the session's outputs in order, and converts between
the wire messages and the supervisor's and GPU source's own types: the GPU snapshot in
``agent.gpu_reports``, the shard reports in ``agent.reports``, and here what a start command
needs (``start_refusal``, ``shard_spec``) and the hello.

Engines never depend on the connection: they keep running while the agent is disconnected
and after it exits, and the next ``hello`` lists every one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace

import structlog
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from agent.config import AgentConfig
from agent.connection import ConnectionFatal
from agent.engines import (
    EngineError,
    EngineSupervisor,
    ShardChange,
    ShardKey,
    ShardRecord,
    ShardSpec,
    ShardState,
)
from agent.engines.inventory import FAILED_KEPT
from agent.gpu_duplicates import without_duplicate_gpus
from agent.gpu_inventory import GpuInventory, gpu_inventory, inventory_change
from agent.gpu_limit import GpusOverLimit, over_limit_refusal, within_node_limit
from agent.gpu_reports import (
    VANISHED_GPU_REASON,
    MemoryReadings,
    displaced_gpus,
    gpu_health_changes,
    gpu_report,
    with_vanished_gpus,
)
from agent.gpus import GpuSnapshot, GpuSource, GpuStatus
from agent.reports import heartbeat_shard, shard_report, shard_status, unreportable_refusal
from agent.session import (
    Close,
    CommandLedger,
    Execute,
    HeartbeatContent,
    Output,
    Send,
    ServerSession,
)
from wire.errors import MessageTooLarge
from wire.messages import (
    MAX_ERROR_CHARS,
    MAX_GPUS_PER_NODE,
    MAX_SHARDS_PER_NODE,
    PROTOCOL_VERSION,
    AgentCommand,
    CloseCode,
    CommandResult,
    GpuHealthChange,
    Hello,
    StartShard,
    StopShard,
    encode,
    fit_close_reason,
)
from wire.turns import Turns
from wire.version import llmgw_version

log = structlog.get_logger("llmgw.agent")

GPU_POLL_INTERVAL_S = 3.0
SHARD_END_READ_DELAY_S = 0.2
"""How long after a shard ends (stopped or failed) the agent reads its GPUs again, so the
next heartbeat says the memory its engine freed rather than placement counting it until
the next poll. The shards that end within it (a drain stops all of a node's at once) share
the one read, and reads for ended shards come at most once per this delay."""
TICK_INTERVAL_S = 0.25
CLOSE_TIMEOUT_S = 2.0
FLUSH_TIMEOUT_S = 5.0
"""How long stopping the agent waits for the stops it reports to go out."""

MAX_RUNNING_SHARDS = MAX_SHARDS_PER_NODE - FAILED_KEPT
"""Most shards the agent runs at once: with the failed ones it keeps, every one is in the
next hello, and a hello that lists more than ``MAX_SHARDS_PER_NODE`` is refused, so the
node could never connect again to be told to stop any of them."""

_RUNNING = frozenset({ShardState.STARTING, ShardState.READY})
_ENDED = frozenset({ShardState.STOPPED, ShardState.FAILED})


# -- start commands and the hello --------------------------------------------------------


def shard_spec(command: StartShard) -> ShardSpec:
    """The argv arrives rendered; peers are already in it, so they are not passed on."""
    return ShardSpec(
        replica_id=command.replica_id,
        shard_index=command.shard_index,
        model=command.model,
        argv=command.argv,
        env=dict(command.env),
        gpus=command.gpus,
        port=command.port,
        engine=command.engine,
    )


def start_refusal(
    command: StartShard,
    port_range: tuple[int, int],
    gpus: Sequence[GpuStatus],
    shards: Sequence[ShardRecord],
) -> str | None:
    """Why this node cannot run the shard as asked, or None when it can. ``shards``: the
    supervisor's inventory; the port of one that runs (another shard's) is taken."""
    unreportable = unreportable_refusal(command)
    if unreportable is not None:
        return unreportable
    low, high = port_range
    if not low <= command.port <= high:
        return f"port {command.port} is outside this node's port range {low}-{high}"
    known = {gpu.index for gpu in gpus}
    unknown = sorted(set(command.gpus) - known)
    if unknown:
        return f"GPU(s) {unknown} do not exist on this node (it has {sorted(known)})"
    gone = sorted(gpu.index for gpu in gpus if gpu.index in command.gpus and not gpu.listed)
    if gone:
        return f"GPU(s) {gone} are {VANISHED_GPU_REASON}"
    twice = sorted(index for index, times in Counter(command.gpus).items() if times > 1)
    if twice:
        return f"GPU(s) {twice} are listed twice"
    key = ShardKey(command.replica_id, command.shard_index)
    others = [record for record in shards if record.state in _RUNNING and record.key != key]
    for record in others:
        if record.port == command.port:
            return (
                f"port {command.port} is already used by replica {record.replica_id} "
                f"shard {record.shard_index} (pid {record.pid})"
            )
    if len(others) >= MAX_RUNNING_SHARDS:
        return f"this node already runs {len(others)} shards, the most it can report"
    return None


def build_hello(
    config: AgentConfig,
    gpus: Sequence[GpuStatus],
    shards: Sequence[ShardRecord],
    local_address: str = "",
    failures: Mapping[ShardKey, str] | None = None,
) -> Hello:
    """``local_address``: where this connection leaves from, advertised unless
    ``--address`` says otherwise; ``failures``: why each failed shard failed."""
    failures = failures or {}
    return Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id=config.node_id,
        agent_version=llmgw_version(),
        address=config.address or local_address,
        labels=dict(config.labels),
        port_range=config.port_range,
        gpus=tuple(gpu_report(gpu) for gpu in gpus),
        shards=tuple(shard_report(record, failures.get(record.key)) for record in shards),
    )


# -- the runtime -------------------------------------------------------------------------


class CommandRefused(Exception):
    """A command this node cannot carry out as asked."""


class HelloTooLarge(ConnectionFatal):
    """This node's hello is over the message limit: the control plane could not read it,
    so connecting again cannot help until its shards are stopped by hand."""


@dataclass(eq=False)
class _Link:
    """The current connection: its session and the queue of its outputs, in order."""

    session: ServerSession
    outbox: asyncio.Queue[Output] = field(default_factory=asyncio.Queue)
    writer: asyncio.Task[None] | None = None
    said: GpuInventory | None = None
    """The GPUs this connection's hello listed; None until it is sent."""
    closing: bool = False

    def push(self, outputs: Sequence[Output]) -> None:
        for output in outputs:
            self.outbox.put_nowait(output)


class AgentRuntime:
    def __init__(
        self,
        config: AgentConfig,
        gpu_source: GpuSource,
        *,
        clock: Callable[[], float] = time.monotonic,
        gpu_poll_interval_s: float = GPU_POLL_INTERVAL_S,
    ) -> None:
        self._config = config
        self._gpu_source = gpu_source
        self._clock = clock
        self._gpu_poll_interval_s = gpu_poll_interval_s
        self._gpu_lock = asyncio.Lock()
        self._snapshot = GpuSnapshot(gpus=())
        self._duplicate_gpus: set[tuple[str, int, str, int, str]] = set()
        self._gpus_left_out: tuple[tuple[int, str], ...] = ()
        """The index and UUID of each GPU the source lists past ``MAX_GPUS_PER_NODE``
        (``agent.gpu_limit``)."""
        self._started = False
        self._unreported_gpu_changes: list[GpuHealthChange] = []
        self._memory_readings = MemoryReadings()
        self._shard_ended = asyncio.Event()
        """Set when a shard stops or fails: ``watch_gpus`` reads the GPUs again soon."""
        self._supervisor = EngineSupervisor(
            config.state_dir, self._shard_changed, liveness=config.liveness
        )
        self._ledger = CommandLedger()
        self._causes: dict[ShardKey, str] = {}
        self._turns: Turns[ShardKey] = Turns()
        self._link: _Link | None = None
        self._local_address = ""
        self._commands: set[asyncio.Task[None]] = set()
        self._fatal: ConnectionFatal | None = None

    @property
    def supervisor(self) -> EngineSupervisor:
        return self._supervisor

    async def start(self) -> None:
        """Read the GPUs and re-attach the engines an earlier agent process left running.
        Raises ``GpusOverLimit``, re-attaching nothing, when the GPU source lists more GPUs
        than a node may report."""
        await self.refresh_gpus()
        if self._gpus_left_out:
            listed = len(self._snapshot.gpus) + len(self._gpus_left_out)
            raise GpusOverLimit(over_limit_refusal(listed))
        self._started = True
        adopted = await self._supervisor.reattach()
        log.info(
            "agent_started",
            gpus=len(self._snapshot.gpus),
            reattached=[f"{record.replica_id}/{record.shard_index}" for record in adopted],
        )

    async def watch_gpus(self) -> None:
        """Poll GPU health and memory for ever, and once more ``SHARD_END_READ_DELAY_S``
        after shards end; changes go out with the next heartbeat."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._gpu_poll_interval_s):
                    await self._shard_ended.wait()
                    await asyncio.sleep(SHARD_END_READ_DELAY_S)
            # Cleared before the read: a shard that ends while it runs gets a read of its own.
            self._shard_ended.clear()
            await self.refresh_gpus()

    async def refresh_gpus(self) -> None:
        async with self._gpu_lock:
            try:
                snapshot = await asyncio.to_thread(self._gpu_source.snapshot)
            except Exception as exc:
                log.warning("gpu_snapshot_failed", error=str(exc))
                return
            self._take(snapshot)
            self._close_if_inventory_changed()

    def _close_if_inventory_changed(self) -> None:
        """Close the connection once its hello no longer lists this node's GPUs: the
        reconnect loop dials again after its backoff and the next hello lists them (the
        control plane takes the inventory from hellos only). The backoff bounds a flapping
        inventory: a connection that ends within ``STABLE_AFTER_S`` doubles the wait, up
        to 30 s, and the hub refuses a node that connects more than 10 times a minute."""
        link = self._link
        if link is None or link.said is None or link.closing:
            return
        why = inventory_change(link.said, gpu_inventory(self._snapshot.gpus))
        if why is None:
            return
        link.closing = True
        log.info("gpu_inventory_changed", reason=why)
        link.push([Close(CloseCode.GOING_AWAY, fit_close_reason(why))])

    def _take(self, snapshot: GpuSnapshot) -> None:
        reason = snapshot.unavailable_reason
        if reason and reason != self._snapshot.unavailable_reason:
            log.warning("gpus_unavailable", reason=reason)
        for event in snapshot.xid_events:
            log.warning(
                "gpu_xid", gpu=event.gpu_index, xid=event.xid, description=event.description
            )
        for gone, holder in displaced_gpus(self._snapshot, snapshot):
            log.warning(
                "vanished_gpu_left_out",
                gpu=gone.index,
                uuid=gone.uuid,
                index_now_of=holder.uuid,
                reason=f"{VANISHED_GPU_REASON}, and another GPU is listed under its index",
            )
        snapshot = self._within_limit(
            self._without_duplicates(with_vanished_gpus(self._snapshot, snapshot))
        )
        changes = gpu_health_changes(self._snapshot.gpus, snapshot.gpus)
        for change in changes:
            log.info(
                "gpu_health_changed", gpu=change.index, healthy=change.healthy, reason=change.reason
            )
        if self._link is not None:
            # Disconnected, the next hello says every GPU's health as it is then: changes
            # kept until then would only pile up while the control plane is away.
            self._unreported_gpu_changes.extend(changes)
        self._snapshot = snapshot

    def _without_duplicates(self, snapshot: GpuSnapshot) -> GpuSnapshot:
        """``snapshot`` as a hello the control plane accepts lists it: no GPU index and no
        UUID twice. The GPU source and ``with_vanished_gpus`` never list one twice; a
        snapshot that did anyway would be refused in every hello, and the node could not
        connect until the agent restarted. Each correction is logged once, when it begins."""
        gpus, duplicates = without_duplicate_gpus(snapshot.gpus)
        for duplicate in duplicates:
            if duplicate.which not in self._duplicate_gpus:
                log.warning(
                    "duplicate_gpu_corrected",
                    gpu=duplicate.gpu.index,
                    uuid=duplicate.gpu.uuid,
                    shared=duplicate.shared,
                    with_gpu=duplicate.kept.index,
                    with_uuid=duplicate.kept.uuid,
                    outcome=duplicate.outcome,
                )
        self._duplicate_gpus = {duplicate.which for duplicate in duplicates}
        return replace(snapshot, gpus=gpus) if duplicates else snapshot

    def _within_limit(self, snapshot: GpuSnapshot) -> GpuSnapshot:
        """``snapshot`` cut to the GPUs a hello may list (``agent.gpu_limit``); the GPUs
        left out are logged when they change, so the node never loses one unsaid (at the
        start ``start`` refuses instead)."""
        gpus, left_out = within_node_limit(snapshot.gpus)
        which = tuple((gpu.index, gpu.uuid) for gpu in left_out)
        if self._started and which and which != self._gpus_left_out:
            log.warning(
                "gpus_over_node_limit",
                listed=len(snapshot.gpus),
                reported=len(gpus),
                left_out=[f"{index} {uuid}" for index, uuid in which],
                reason=f"a node may report at most {MAX_GPUS_PER_NODE} GPUs: the first by "
                "index are reported, the others are not used until the agent restarts, "
                "which refuses to start while the node has more",
            )
        self._gpus_left_out = which
        return replace(snapshot, gpus=gpus) if which else snapshot

    async def serve(self, websocket: ClientConnection) -> bool:
        """Speak the protocol over ``websocket`` until it closes; True if the control plane
        welcomed this agent on it."""
        await self.refresh_gpus()
        self._local_address = _local_host(websocket)
        session = ServerSession(
            node_id=self._config.node_id,
            hello_factory=self._hello,
            now=self._clock(),
            heartbeat_content=self._heartbeat_content,
            commands=self._ledger,
        )
        link = _Link(session)
        self._link = link
        writer = link.writer = asyncio.create_task(self._write(websocket, link))
        ticker = asyncio.create_task(self._tick(link))
        try:
            link.push(session.opened(self._clock()))
            async for frame in websocket:
                link.push(session.receive(frame, self._clock()))
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await websocket.close(CloseCode.GOING_AWAY, "agent shutting down")
            raise
        finally:
            session.connection_lost()
            if self._link is link:
                self._link = None
            for task in (writer, ticker):
                task.cancel()
            await asyncio.gather(writer, ticker, return_exceptions=True)
        if self._fatal is not None:
            raise self._fatal
        return session.welcome is not None

    async def stop_engines(self, reason: str, grace_s: float) -> int:
        """Stop every engine (nothing starts from now on), each reported ``stopped`` with
        ``reason``, and wait until the connection, if there is one, has sent those
        reports. How many engines were stopped."""
        running = sum(r.state in _RUNNING for r in self._supervisor.inventory())
        await self._supervisor.shutdown(stop_engines=True, grace_s=grace_s, reason=reason)
        await self._flush()
        return running

    async def _flush(self) -> None:
        """Until every output queued so far went out, the connection ended, or
        ``FLUSH_TIMEOUT_S`` passed."""
        link = self._link
        if link is None or link.writer is None:
            return
        sent = asyncio.create_task(link.outbox.join())
        try:
            await asyncio.wait(
                {sent, link.writer}, timeout=FLUSH_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            sent.cancel()

    async def close(self) -> None:
        """Stop watching the engines, leaving them running, and release the GPU source."""
        for task in list(self._commands):
            task.cancel()
        await asyncio.gather(*self._commands, return_exceptions=True)
        await self._supervisor.shutdown(stop_engines=False)
        self._gpu_source.close()

    # -- the session's callbacks ---------------------------------------------------------

    def _hello(self) -> Hello:
        # The hello carries every GPU's health, so older changes need no heartbeat.
        self._unreported_gpu_changes.clear()
        if self._link is not None:
            self._link.said = gpu_inventory(self._snapshot.gpus)
        self._memory_readings.said(self._snapshot.gpus)
        shards = self._supervisor.inventory()
        failures = {
            record.key: failure
            for record in shards
            if (failure := self._supervisor.failure(record.key)) is not None
        }
        return build_hello(self._config, self._snapshot.gpus, shards, self._local_address, failures)

    def _heartbeat_content(self) -> HeartbeatContent:
        changes = tuple(self._unreported_gpu_changes)
        self._unreported_gpu_changes.clear()
        shards = tuple(heartbeat_shard(record) for record in self._supervisor.inventory())
        memory = self._memory_readings.changed(self._snapshot.gpus)
        return HeartbeatContent(gpu_changes=changes, shards=shards, gpu_memory=memory)

    def _shard_changed(self, change: ShardChange) -> None:
        key = ShardKey(change.replica_id, change.shard_index)
        command_id = self._causes.get(key)
        if change.state is not ShardState.STARTING:
            self._causes.pop(key, None)
        # A failed engine is something refused or degraded and handled (app/logs.py):
        # the control plane replaces it, but an operator filtering on warnings sees why.
        log.log(
            logging.WARNING if change.state is ShardState.FAILED else logging.INFO,
            "shard_changed",
            replica_id=change.replica_id,
            shard_index=change.shard_index,
            model=change.model,
            state=change.state.value,
            pid=change.pid,
            error=change.error,
            exit_code=change.exit_code,
            reason=change.reason,
            command_id=command_id,
        )
        if change.state in _ENDED:
            self._shard_ended.set()
        status = shard_status(change, command_id)
        link = self._link
        if status is not None and link is not None:
            link.push(link.session.report_shard(status))

    # -- commands ------------------------------------------------------------------------

    async def _execute(self, command: AgentCommand) -> None:
        # Every line logged while carrying out the command names it and its shard.
        with structlog.contextvars.bound_contextvars(
            command_id=command.command_id,
            replica_id=command.replica_id,
            shard_index=command.shard_index,
        ):
            await self._carry_out(command)

    async def _carry_out(self, command: AgentCommand) -> None:
        log.info("command_received", command=type(command).__name__)
        error: str | None = None
        try:
            match command:
                case StartShard():
                    await self._start_shard(command)
                case StopShard():
                    await self._stop_shard(command)
        except (EngineError, CommandRefused) as exc:
            error = str(exc)
        except Exception as exc:
            log.exception("command_failed")
            error = f"unexpected error: {exc}"
        log.info("command_finished", ok=error is None, error=error)
        self._finished(command.command_id, error)

    async def _start_shard(self, command: StartShard) -> None:
        key = ShardKey(command.replica_id, command.shard_index)
        async with self._turns.of(key):
            # Judged in the shard's turn: a stop of it that runs first frees its port. From
            # here until the supervisor watches the new engine nothing awaits, so no other
            # start can take the port in between.
            refusal = start_refusal(
                command, self._config.port_range, self._snapshot.gpus, self._supervisor.inventory()
            )
            if refusal is not None:
                raise CommandRefused(refusal)
            if self._supervisor.running(key) is None:
                # A start for a shard already running starts nothing (or is refused):
                # what the shard does next is the earlier start's, not this command's.
                self._causes[key] = command.command_id
            await self._supervisor.start(shard_spec(command))

    async def _stop_shard(self, command: StopShard) -> None:
        key = ShardKey(command.replica_id, command.shard_index)
        async with self._turns.of(key):
            self._causes[key] = command.command_id
            await self._supervisor.stop(command.replica_id, command.shard_index, command.grace_s)

    def _finished(self, command_id: str, error: str | None) -> None:
        link = self._link
        if link is not None:
            link.push(link.session.command_finished(command_id, error is None, error))
            return
        # No connection: remember the result so that a re-sent command gets it.
        cut = None if error is None else error[:MAX_ERROR_CHARS]
        self._ledger.finished(CommandResult(command_id=command_id, ok=error is None, error=cut))

    def _spawn(self, coroutine: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._commands.add(task)
        task.add_done_callback(self._commands.discard)

    # -- the connection's tasks ----------------------------------------------------------

    async def _write(self, websocket: ClientConnection, link: _Link) -> None:
        while True:
            output = await link.outbox.get()
            try:
                if not await self._perform(websocket, output):
                    return
            finally:
                link.outbox.task_done()

    async def _perform(self, websocket: ClientConnection, output: Output) -> bool:
        """Carry out one output of the session; False once the connection is done."""
        match output:
            case Send(message):
                try:
                    data = encode(message)
                except MessageTooLarge as exc:
                    log.error("message_too_large", type=type(message).__name__, error=str(exc))
                    if not isinstance(message, Hello):
                        return True
                    # Without its hello the connection times out, and so would every next
                    # one: end the agent, saying why, rather than reconnect for ever.
                    self._fatal = HelloTooLarge(
                        f"this node's hello of {exc.size} bytes is over the {exc.limit}-byte "
                        f"message limit, so the control plane cannot read it: it lists "
                        f"{len(message.shards)} shards and {len(message.gpus)} GPUs; stop "
                        "some of this node's engines and start the agent again"
                    )
                    await websocket.close(CloseCode.MESSAGE_TOO_BIG, "hello too large")
                    return False
                try:
                    await websocket.send(data, text=True)
                except ConnectionClosed:
                    return False
            case Close(code, reason):
                log.info("closing_connection", code=int(code), reason=reason)
                await websocket.close(code, reason)
                return False
            case Execute(command):
                self._spawn(self._execute(command))
        return True

    async def _tick(self, link: _Link) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL_S)
            link.push(link.session.tick(self._clock()))


def _local_host(websocket: ClientConnection) -> str:
    """The IP this connection leaves from: what the control plane sees it come from (unless
    a NAT stands between them, when ``--address`` and a certificate naming it are needed)."""
    address = websocket.local_address
    if isinstance(address, tuple) and address:
        return str(address[0])
    return ""
