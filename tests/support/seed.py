"""A realistic two weeks of cluster history, appended through the real event store.

The story, in UTC (``AUDIT_WEEK`` is the week of Monday 2026-03-02):

The week before:
    Mon 02-23  bob declares llama-3-8b (2 replicas) and qwen-2-7b (1 replica, 300 s
               startup timeout); agents on gpu-07 and gpu-08 register and connect; the
               reconciler places llama-3-8b-1 (gpu-07), llama-3-8b-2 (gpu-08) and
               qwen-2-7b-1 (gpu-07), which start and serve.
    Tue 02-24  bob creates the API key ci-pipeline (k-ci-7f3a).
    Thu 02-26  gpu-07 GPU 3 has a double-bit ECC error (Xid 48) and recovers after a reset.
The audit week:
    Mon 03-02  gpu-08 GPU 1 falls off the bus (Xid 79) and stays unhealthy.
    Tue 03-03  bob scales qwen-2-7b to 2; qwen-2-7b-2 is placed on gpu-08, hangs loading
               weights, times out in starting after 300 s and is killed (its shard fails
               with the engine's log tail); qwen-2-7b-3 replaces it on gpu-07.
    Wed 03-04  an agent with gpu-12's certificate claims to be gpu-07 and is refused.
    Thu 03-05  alice drains gpu-08 (correlation id drain-4e1c): llama-3-8b-3 is placed on
               gpu-07 to replace llama-3-8b-2, serves, and only then is llama-3-8b-2
               taken out of routing and stopped; the drain finishes.
    Fri 03-06  alice revokes ci-pipeline and creates support-bot (k-support-91b0).
After it:
    Tue 03-10  bob uncordons gpu-08.

Every step is appended with the actor and correlation id the control plane would record,
and at its own time through a scripted clock, so audits over time windows have known
answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    ApiKeyCreated,
    ApiKeyRevoked,
    GpuInfo,
    GpuMarkedUnhealthy,
    GpuRecovered,
    IdentityRejected,
    ModelDeclared,
    ModelScaled,
    NodeConnected,
    NodeDrainCancelled,
    NodeDrainFinished,
    NodeDrainRequested,
    NodeRegistered,
    NodeUncordoned,
    ReplacementServing,
    ReplicaDrainStarted,
    ReplicaPlaced,
    ReplicaServing,
    ReplicaStartupTimedOut,
    ReplicaStopped,
    ReplicaStopping,
    ShardFailed,
    ShardPlacement,
    ShardReady,
    ShardStarting,
    ShardStopped,
    key_stream,
    model_stream,
    node_stream,
    replica_stream,
)
from app.domain.model_spec import ModelSpec
from app.store.database import create_engine
from app.store.interface import AppendRequest, NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.postgres import PostgresServer, unique_database_name

RECONCILER = "reconciler"
AGENT_HUB = "agent-hub"
"""The actor of what the agent hub records about connections it refuses."""

AUDIT_WEEK = (datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 9, tzinfo=UTC))

TIMED_OUT_LOG_TAIL = (
    "INFO 03-03 14:00:09 llm_engine.py:161] Initializing an LLM engine (v0.6.3) with "
    "config: model='Qwen/Qwen2-7B-Instruct', tensor_parallel_size=1",
    "INFO 03-03 14:00:12 model_runner.py:1056] Starting to load model Qwen/Qwen2-7B-Instruct...",
    "INFO 03-03 14:00:13 weight_utils.py:243] Using model weights format ['*.safetensors']",
    "WARNING 03-03 14:02:13 utils.py:721] Loading safetensors shard 2/4 took 120 s; "
    "is the model cache at /models on a slow volume?",
)

LLAMA = ModelSpec(
    name="llama-3-8b",
    command="vllm serve meta-llama/Meta-Llama-3-8B-Instruct --port {port}",
    gpu_memory_gib=20,
    replicas=2,
)
QWEN = ModelSpec(
    name="qwen-2-7b",
    command="vllm serve Qwen/Qwen2-7B-Instruct --port {port}",
    gpu_memory_gib=18,
    replicas=1,
    startup_timeout_s=300,
)
NODES = {"gpu-07": "127.0.3.7", "gpu-08": "127.0.3.8"}
DRAIN_REQUESTED_AT = datetime(2026, 3, 5, 16, 0, tzinfo=UTC)


def utc(month: int, day: int, hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


def agent(node_id: str) -> str:
    return f"agent:{node_id}"


def h100(index: int) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:08x}-h100",
        name="NVIDIA H100 80GB HBM3",
        memory_total_mib=81559,
    )


@dataclass(frozen=True)
class SeededHistory:
    """What the seeded story is about, for tests to ask and check against."""

    operator: str = "alice"
    setup_operator: str = "bob"
    drained_node: str = "gpu-08"
    kept_node: str = "gpu-07"
    drain_id: str = "drain-4e1c"
    drain_requested_at: datetime = DRAIN_REQUESTED_AT
    drained_replica: str = "llama-3-8b-2"
    replacement: str = "llama-3-8b-3"
    timed_out_replica: str = "qwen-2-7b-2"
    timed_out_log_tail: tuple[str, ...] = TIMED_OUT_LOG_TAIL
    revoked_key: str = "k-ci-7f3a"
    created_key: str = "k-support-91b0"
    audit_week: tuple[datetime, datetime] = AUDIT_WEEK
    positions: dict[str, list[int]] = field(default_factory=dict)
    """The positions recorded on each stream, in order."""

    @property
    def psql_variables(self) -> dict[str, str]:
        """Values for the ``:'name'`` variables of docs/audit.md."""
        since, until = self.audit_week
        return {
            "node": self.drained_node,
            "drain": self.drain_id,
            "replica": self.drained_replica,
            "since": f"{since:%Y-%m-%d %H:%M:%S}+00",
            "until": f"{until:%Y-%m-%d %H:%M:%S}+00",
        }


@dataclass
class _ScriptedClock:
    now: datetime = AUDIT_WEEK[0]

    def __call__(self) -> datetime:
        return self.now


class _Recorder:
    """Appends each step at its own time, as one decision of one actor."""

    def __init__(self, engine: AsyncEngine, seeded: SeededHistory) -> None:
        self._clock = _ScriptedClock()
        self._store = PostgresEventStore(engine, clock=self._clock)
        self._positions = seeded.positions

    async def at(
        self, moment: datetime, actor: str, *events: AnyEvent, correlation_id: str | None = None
    ) -> None:
        self._clock.now = moment
        requests = [AppendRequest(stream_of(event), None, [NewEvent(event)]) for event in events]
        meta = Meta(actor=actor, correlation_id=correlation_id)
        for recorded in await self._store.append_many(requests, meta):
            self._positions.setdefault(recorded.stream, []).append(recorded.position)


async def seed_history(engine: AsyncEngine) -> SeededHistory:
    """Append the story told in this module's docstring to an empty, migrated database."""
    seeded = SeededHistory()
    record = _Recorder(engine, seeded)
    await _setting_up(record)
    await _the_week_before(record)
    await _a_gpu_falls_off_the_bus(record)
    await _a_replica_times_out_in_starting(record)
    await _an_identity_is_refused(record)
    await _alice_drains_gpu_08(record, seeded)
    await _keys_change_hands(record)
    await record.at(utc(3, 10, 8, 15), "bob", NodeUncordoned(node_id="gpu-08"))
    return seeded


@dataclass(frozen=True)
class SeededDatabase:
    url: str
    story: SeededHistory


@asynccontextmanager
async def seeded_database(
    server: PostgresServer, migrated_template: str
) -> AsyncIterator[SeededDatabase]:
    """A new database holding the story, dropped on exit; for tests that only read it, or
    add events about entities the story does not know."""
    name = unique_database_name("llmgw_seeded")
    await server.create_database(name, template=migrated_template)
    try:
        engine = create_engine(server.url(name), pool_size=1)
        try:
            story = await seed_history(engine)
        finally:
            await engine.dispose()
        yield SeededDatabase(server.url(name), story)
    finally:
        await server.drop_database(name)


async def _setting_up(record: _Recorder) -> None:
    await record.at(utc(2, 23, 9, 0), "bob", ModelDeclared(model=LLAMA.name, spec=LLAMA))
    await record.at(utc(2, 23, 9, 0, 30), "bob", ModelDeclared(model=QWEN.name, spec=QWEN))
    for n, (node_id, address) in enumerate(NODES.items()):
        gpus = tuple(h100(index) for index in range(4))
        await record.at(
            utc(2, 23, 9, 5, 10 * n),
            agent(node_id),
            NodeRegistered(node_id=node_id, address=address, gpus=gpus, agent_version="0.1.0"),
            NodeConnected(
                node_id=node_id,
                address=address,
                remote_address=f"{address}:4431{n}",
                gpus=gpus,
                agent_version="0.1.0",
            ),
        )
    await record.at(
        utc(2, 23, 9, 6),
        RECONCILER,
        placed("llama-3-8b", 1, "gpu-07", gpu=0, port=20000),
        placed("llama-3-8b", 2, "gpu-08", gpu=0, port=20000),
        placed("qwen-2-7b", 1, "gpu-07", gpu=1, port=20001),
    )
    on_gpu_07, on_gpu_08 = ("llama-3-8b-1", "qwen-2-7b-1"), ("llama-3-8b-2",)
    for node_id, replicas in (("gpu-07", on_gpu_07), ("gpu-08", on_gpu_08)):
        await record.at(
            utc(2, 23, 9, 6, 2),
            agent(node_id),
            *(starting(replica, node_id, pid=4100 + n) for n, replica in enumerate(replicas)),
        )
        await record.at(
            utc(2, 23, 9, 7, 40), agent(node_id), *(ready(replica, node_id) for replica in replicas)
        )
    await record.at(
        utc(2, 23, 9, 7, 41),
        RECONCILER,
        *(ReplicaServing(replica_id=replica) for replica in on_gpu_07 + on_gpu_08),
    )


async def _the_week_before(record: _Recorder) -> None:
    await record.at(
        utc(2, 24, 10, 0),
        "bob",
        ApiKeyCreated(
            key_id="k-ci-7f3a",
            name="ci-pipeline",
            prefix="llmgw_7f3a",
            secret_hash="sha256:5f1d0c2e",
            models=("llama-3-8b",),
            rpm=600,
        ),
    )
    await record.at(
        utc(2, 26, 3, 12),
        agent("gpu-07"),
        GpuMarkedUnhealthy(
            node_id="gpu-07",
            gpu_index=3,
            gpu_uuid=h100(3).uuid,
            reason="Xid 48: double-bit ECC error",
            xid=48,
        ),
    )
    await record.at(
        utc(2, 26, 7, 40),
        agent("gpu-07"),
        GpuRecovered(node_id="gpu-07", gpu_index=3, gpu_uuid=h100(3).uuid),
    )


async def _a_gpu_falls_off_the_bus(record: _Recorder) -> None:
    await record.at(
        utc(3, 2, 10, 0),
        agent("gpu-08"),
        GpuMarkedUnhealthy(
            node_id="gpu-08",
            gpu_index=1,
            gpu_uuid=h100(1).uuid,
            reason="Xid 79: GPU has fallen off the bus",
            xid=79,
        ),
    )


async def _a_replica_times_out_in_starting(record: _Recorder) -> None:
    stuck, replacement = "qwen-2-7b-2", "qwen-2-7b-3"
    await record.at(utc(3, 3, 14, 0), "bob", ModelScaled(model="qwen-2-7b", replicas=2, previous=1))
    await record.at(utc(3, 3, 14, 0, 1), RECONCILER, placed("qwen-2-7b", 2, "gpu-08", 2, 20001))
    await record.at(utc(3, 3, 14, 0, 3), agent("gpu-08"), starting(stuck, "gpu-08", pid=5230))
    await record.at(
        utc(3, 3, 14, 5, 3),
        RECONCILER,
        ReplicaStartupTimedOut(replica_id=stuck, timeout_s=300, waited_s=300),
    )
    await record.at(
        utc(3, 3, 14, 5, 5),
        agent("gpu-08"),
        ShardFailed(
            replica_id=stuck,
            shard_index=0,
            node_id="gpu-08",
            error="killed after the startup timeout",
            exit_code=-9,
            log_tail=TIMED_OUT_LOG_TAIL,
        ),
    )
    await record.at(
        utc(3, 3, 14, 5, 6),
        RECONCILER,
        placed("qwen-2-7b", 3, "gpu-07", 2, 20002, reason="startup timeout", replaces=stuck),
    )
    await record.at(utc(3, 3, 14, 5, 8), agent("gpu-07"), starting(replacement, "gpu-07", 4388))
    await record.at(utc(3, 3, 14, 6, 20), agent("gpu-07"), ready(replacement, "gpu-07"))
    await record.at(utc(3, 3, 14, 6, 21), RECONCILER, ReplicaServing(replica_id=replacement))


async def _an_identity_is_refused(record: _Recorder) -> None:
    await record.at(
        utc(3, 4, 9, 30),
        AGENT_HUB,
        IdentityRejected(
            claimed_node_id="gpu-07",
            certificate_subject="O=llmgw,CN=gpu-12",
            remote_address="127.0.3.12:50412",
            reason="the certificate names gpu-12, not the node id claimed",
        ),
    )


async def _alice_drains_gpu_08(record: _Recorder, seeded: SeededHistory) -> None:
    drain, old, new = seeded.drain_id, seeded.drained_replica, seeded.replacement
    # Her request is recorded in her name; the reconciler carries out the move under the
    # drain's id.
    await record.at(
        seeded.drain_requested_at,
        seeded.operator,
        NodeDrainRequested(node_id="gpu-08", drain_id=drain, grace_s=900),
        correlation_id=drain,
    )
    await record.at(
        seeded.drain_requested_at + timedelta(seconds=1),
        RECONCILER,
        ReplicaDrainStarted(replica_id=old, drain_id=drain, reason="node gpu-08 drains"),
        placed("llama-3-8b", 3, "gpu-07", 3, 20003, reason=f"drain {drain}", replaces=old),
        correlation_id=drain,
    )
    await record.at(utc(3, 5, 16, 0, 2), agent("gpu-07"), starting(new, "gpu-07", pid=4420))
    await record.at(utc(3, 5, 16, 1, 30), agent("gpu-07"), ready(new, "gpu-07"))
    await record.at(utc(3, 5, 16, 1, 30), RECONCILER, ReplicaServing(replica_id=new))
    await record.at(
        utc(3, 5, 16, 1, 31),
        RECONCILER,
        ReplacementServing(replica_id=old, replacement_id=new),
        ReplicaStopping(replica_id=old, reason=f"drain {drain}: {new} is serving"),
        correlation_id=drain,
    )
    await record.at(
        utc(3, 5, 16, 1, 45),
        agent("gpu-08"),
        ShardStopped(replica_id=old, shard_index=0, node_id="gpu-08", exit_code=0),
    )
    await record.at(
        utc(3, 5, 16, 1, 45),
        RECONCILER,
        ReplicaStopped(replica_id=old),
        NodeDrainFinished(node_id="gpu-08", drain_id=drain, outcome="moved 1 replica"),
        correlation_id=drain,
    )


async def _keys_change_hands(record: _Recorder) -> None:
    await record.at(utc(3, 6, 11, 0), "alice", ApiKeyRevoked(key_id="k-ci-7f3a"))
    await record.at(
        utc(3, 6, 11, 2),
        "alice",
        ApiKeyCreated(
            key_id="k-support-91b0",
            name="support-bot",
            prefix="llmgw_91b0",
            secret_hash="sha256:9a77b3e0",
            models=("qwen-2-7b",),
            rpm=120,
            tpm=200_000,
        ),
    )


def placed(
    model: str,
    number: int,
    node_id: str,
    gpu: int,
    port: int,
    *,
    reason: str = "scale up",
    replaces: str | None = None,
) -> ReplicaPlaced:
    return ReplicaPlaced(
        replica_id=f"{model}-{number}",
        model=model,
        number=number,
        shards=(ShardPlacement(index=0, node_id=node_id, gpus=(gpu,), port=port),),
        reason=reason,
        replaces=replaces,
    )


def starting(replica_id: str, node_id: str, pid: int) -> ShardStarting:
    return ShardStarting(replica_id=replica_id, shard_index=0, node_id=node_id, pid=pid)


def ready(replica_id: str, node_id: str) -> ShardReady:
    return ShardReady(replica_id=replica_id, shard_index=0, node_id=node_id)


def stream_of(event: AnyEvent) -> str:
    """The stream the control plane appends ``event`` to."""
    match event:
        case ModelDeclared() | ModelScaled():
            return model_stream(event.model)
        case ApiKeyCreated() | ApiKeyRevoked():
            return key_stream(event.key_id)
        case IdentityRejected():
            return node_stream(event.claimed_node_id)
        case (
            NodeRegistered()
            | NodeConnected()
            | NodeUncordoned()
            | NodeDrainRequested()
            | NodeDrainCancelled()
            | NodeDrainFinished()
            | GpuMarkedUnhealthy()
            | GpuRecovered()
        ):
            return node_stream(event.node_id)
        case (
            ReplicaPlaced()
            | ShardStarting()
            | ShardReady()
            | ShardFailed()
            | ShardStopped()
            | ReplicaServing()
            | ReplicaStartupTimedOut()
            | ReplicaDrainStarted()
            | ReplacementServing()
            | ReplicaStopping()
            | ReplicaStopped()
        ):
            return replica_stream(event.replica_id)
    raise ValueError(f"the seed does not record {type(event).__name__} events")
