"""A synthetic history of a busy cluster, for benchmarks that need a realistic log.

``ClusterHistory().steps()`` yields ``(stream, event)`` without end, the same series for
the same seed: ~50 models, ~1,000 nodes with 8 GPUs each and ~4,000 replicas serving at
any time, then the churn of a cluster that runs for months (see the class docstring).
Events are shaped like the control plane's and the agents' own (inventories with every
GPU, engine log tails on failures), so payload sizes are realistic too.

Every address in it is in ``network`` (loopback, 127.1.0.0/16, unless told), so a gateway
pointed at a database of this history can reach nobody's machines:
``tests/unit/test_fixture_addresses.py`` refuses any other address here.
"""

from __future__ import annotations

import ipaddress
import itertools
import uuid
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from random import Random

import msgspec

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
    ModelTuned,
    ModelUnplaceable,
    NodeConnected,
    NodeCordoned,
    NodeDisconnected,
    NodeDrainFinished,
    NodeDrainRequested,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    ReplacementServing,
    ReplicaAdopted,
    ReplicaDrainStarted,
    ReplicaFailed,
    ReplicaLost,
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
    StrayStopped,
    key_stream,
    model_stream,
    node_stream,
    replica_id_for,
    replica_stream,
)
from app.domain.model_spec import ModelSpec

Step = tuple[str, AnyEvent]
"""One event of the history and the stream it belongs to."""

FAMILIES = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "qwen2.5-72b", "mistral-7b",
            "mixtral-8x7b", "gemma-2-27b", "phi-3-mini")  # fmt: skip
COMMAND = "vllm serve /models/{model} --host {host} --port {port} --tensor-parallel-size {gpus}"
GPUS_PER_NODE = 8
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_MEMORY_MIB = 81_559
AGENT_VERSION = "0.1.0"
XIDS = (48, 63, 64, 74, 79, 94, 95)
NODE_NETWORK = "127.1.0.0/16"
STRANGER = "127.9.9.9:51234"
"""Where a connection with another node's certificate comes from."""
ENGINE_LOG_TAIL = tuple(
    f"[rank0]: {line}"
    for line in (
        "INFO loading weights from /models/cache (shard 3 of 8)",
        "WARNING the model's max_model_len exceeds the KV cache: lowering it to 16384",
        "Traceback (most recent call last):",
        '  File "vllm/worker/worker.py", line 184, in determine_num_available_blocks',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "ERROR engine core exited with status 1",
    )
)


class LiveReplica(msgspec.Struct, frozen=True):
    replica_id: str
    model: str
    shards: tuple[ShardPlacement, ...]


class ClusterHistory:
    """A seeded history of a busy cluster, as an endless series of steps.

    It declares the models, registers and connects the nodes and creates API keys, rolls out
    every model's replicas, then churns: rolling moves (most of the log), failed and timed
    out starts, node disconnects, GPU faults, cordons, node drains, scaling, tuning, key
    changes, adoptions, lost replicas and audit-only events. Up to ``in_flight`` operations
    progress at once, their events interleaved at random as a reconciler and many agents
    would write them.
    """

    def __init__(
        self,
        *,
        seed: int = 1129,
        models: int = 50,
        nodes: int = 1_000,
        in_flight: int = 64,
        network: str = NODE_NETWORK,
    ) -> None:
        """``network``: where the nodes' addresses come from, one each, in order."""
        self._network = ipaddress.ip_network(network)
        if self._network.num_addresses < nodes + 2:
            raise ValueError(f"{network} has no room for {nodes} node addresses")
        self._rng = Random(seed)
        self._in_flight = in_flight
        self._specs = {spec.name: spec for spec in map(self._spec, range(models))}
        self._desired = {name: spec.replicas for name, spec in self._specs.items()}
        self._nodes = [f"gpu-{n:04d}" for n in range(1, nodes + 1)]
        self._gpu_uuids = {
            node: [str(uuid.UUID(int=self._rng.getrandbits(128))) for _ in range(GPUS_PER_NODE)]
            for node in self._nodes
        }
        self._serving: dict[str, list[LiveReplica]] = {name: [] for name in self._specs}
        self._numbers: Counter[str] = Counter()
        self._keys: list[str] = []
        self._ports = itertools.count()

    def steps(self) -> Iterator[Step]:
        yield from self._setup()
        rollout: Iterator[Iterator[Step]] = (
            self._start_replica(spec, "scale up")
            for spec in self._specs.values()
            for _ in range(spec.replicas)
        )
        running: list[Iterator[Step]] = []
        while True:
            while len(running) < self._in_flight:
                operation = next(rollout, None)
                running.append(operation if operation is not None else self._next_operation())
            index = self._rng.randrange(len(running))
            step = next(running[index], None)
            if step is None:
                running[index] = running[-1]
                running.pop()
            else:
                yield step

    def _next_operation(self) -> Iterator[Step]:
        weighted: tuple[tuple[Callable[[], Iterator[Step]], float], ...] = (
            (self._rolling_move, 0.45),
            (self._node_flap, 0.18),
            (self._gpu_incident, 0.10),
            (self._cordon, 0.08),
            (self._node_drain, 0.02),
            (self._scale, 0.05),
            (self._tune, 0.05),
            (self._key_change, 0.04),
            (self._audit_only, 0.03),
            (self._adopt, 0.01),
            (self._lose, 0.01),
        )
        makers = [maker for maker, _ in weighted]
        chosen = self._rng.choices(makers, [weight for _, weight in weighted])[0]
        return chosen()

    def _spec(self, index: int) -> ModelSpec:
        gpus = self._rng.choice((1, 1, 1, 1, 2, 2, 4))
        return ModelSpec(
            name=f"{FAMILIES[index % len(FAMILIES)]}-{index:02d}",
            command=COMMAND,
            gpus_per_shard=gpus,
            gpu_memory_gib=70.0,
            shards_per_replica=2 if gpus == 4 and self._rng.random() < 0.5 else 1,
            env={"HF_HOME": "/models/cache"},
            node_selector={"gpu": "h100"},
            replicas=self._rng.randint(40, 120),
        )

    def _setup(self) -> Iterator[Step]:
        for spec in self._specs.values():
            yield model_stream(spec.name), ModelDeclared(model=spec.name, spec=spec)
        for n, node in enumerate(self._nodes):
            yield (
                node_stream(node),
                NodeRegistered(
                    node_id=node,
                    address=self._address(n),
                    labels=_labels(n),
                    gpus=self._gpus(node),
                    agent_version=AGENT_VERSION,
                ),
            )
            yield node_stream(node), self._connected(node)
        for _ in range(200):
            yield from self._create_key()

    # -- replicas ------------------------------------------------------------------------

    def _start_replica(
        self, spec: ModelSpec, reason: str, replaces: str | None = None
    ) -> Generator[Step, None, LiveReplica]:
        """Place replicas until one serves (a start fails or times out now and then)."""
        while True:
            self._numbers[spec.name] += 1
            number = self._numbers[spec.name]
            replica_id = replica_id_for(spec.name, number)
            stream = replica_stream(replica_id)
            shards = self._place(spec)
            yield (
                stream,
                ReplicaPlaced(
                    replica_id=replica_id,
                    model=spec.name,
                    number=number,
                    shards=shards,
                    reason=reason,
                    replaces=replaces,
                ),
            )
            for shard in shards:
                pid = self._rng.randrange(1_000, 4_000_000)
                yield (
                    stream,
                    ShardStarting(
                        replica_id=replica_id,
                        shard_index=shard.index,
                        node_id=shard.node_id,
                        pid=pid,
                    ),
                )
            outcome = self._rng.random()
            if outcome < 0.05:
                yield from self._fail(replica_id, shards, outcome < 0.04, spec.startup_timeout_s)
                reason, replaces = f"replaces {replica_id}", replica_id
                continue
            for shard in shards:
                yield (
                    stream,
                    ShardReady(
                        replica_id=replica_id, shard_index=shard.index, node_id=shard.node_id
                    ),
                )
            yield stream, ReplicaServing(replica_id=replica_id)
            live = LiveReplica(replica_id, spec.name, shards)
            self._serving[spec.name].append(live)
            return live

    def _fail(
        self, replica_id: str, shards: tuple[ShardPlacement, ...], crashed: bool, timeout_s: float
    ) -> Iterator[Step]:
        stream = replica_stream(replica_id)
        first, *others = shards
        if crashed:
            yield (
                stream,
                ShardFailed(
                    replica_id=replica_id,
                    shard_index=first.index,
                    node_id=first.node_id,
                    error="engine exited with status 1",
                    exit_code=1,
                    log_tail=ENGINE_LOG_TAIL,
                ),
            )
        else:
            waited = timeout_s + self._rng.uniform(0, 30)
            yield (
                stream,
                ReplicaStartupTimedOut(replica_id=replica_id, timeout_s=timeout_s, waited_s=waited),
            )
            others = list(shards)
        for shard in others:
            yield (
                stream,
                ShardStopped(
                    replica_id=replica_id,
                    shard_index=shard.index,
                    node_id=shard.node_id,
                    exit_code=0,
                ),
            )
        if crashed:
            yield stream, ReplicaFailed(replica_id=replica_id, reason="shard 0 failed")

    def _stop(self, live: LiveReplica, reason: str) -> Iterator[Step]:
        stream = replica_stream(live.replica_id)
        yield stream, ReplicaStopping(replica_id=live.replica_id, reason=reason)
        for shard in live.shards:
            yield (
                stream,
                ShardStopped(
                    replica_id=live.replica_id,
                    shard_index=shard.index,
                    node_id=shard.node_id,
                    exit_code=0,
                ),
            )
        yield stream, ReplicaStopped(replica_id=live.replica_id)

    def _rolling_move(self, drain_id: str | None = None) -> Iterator[Step]:
        old = self._take_serving()
        if old is None:
            return
        drain_id = drain_id or f"move-{self._hex()}"
        stream = replica_stream(old.replica_id)
        yield stream, ReplicaDrainStarted(replica_id=old.replica_id, drain_id=drain_id)
        spec = self._specs[old.model]
        new = yield from self._start_replica(spec, f"move {old.replica_id}", old.replica_id)
        yield stream, ReplacementServing(replica_id=old.replica_id, replacement_id=new.replica_id)
        yield from self._stop(old, f"replaced by {new.replica_id}")

    def _adopt(self) -> Iterator[Step]:
        """A restarted control plane adopts the shards an agent reports."""
        serving = self._serving[self._rng.choice(list(self._specs))]
        if not serving:
            return
        live = self._rng.choice(serving)
        for shard in live.shards:
            yield (
                replica_stream(live.replica_id),
                ReplicaAdopted(
                    replica_id=live.replica_id,
                    shard_index=shard.index,
                    node_id=shard.node_id,
                    port=shard.port,
                    rule="the log placed it and an agent reports it",
                ),
            )

    def _lose(self) -> Iterator[Step]:
        old = self._take_serving()
        if old is None:
            return
        reason = f"node {old.shards[0].node_id} lost"
        yield replica_stream(old.replica_id), ReplicaLost(replica_id=old.replica_id, reason=reason)
        yield from self._start_replica(self._specs[old.model], "replace lost", old.replica_id)

    def _scale(self) -> Iterator[Step]:
        spec = self._specs[self._rng.choice(list(self._specs))]
        previous = self._desired[spec.name]
        wanted = previous + (1 if previous < 20 or self._rng.random() < 0.5 else -1)
        self._desired[spec.name] = wanted
        yield (
            model_stream(spec.name),
            ModelScaled(model=spec.name, replicas=wanted, previous=previous),
        )
        if wanted > previous:
            yield from self._start_replica(spec, "scale up")
        elif (old := self._take_serving(spec.name)) is not None:
            yield from self._stop(old, "scale down")

    def _tune(self) -> Iterator[Step]:
        model = self._rng.choice(list(self._specs))
        serving = self._serving[model]
        replica_id = None
        if serving and self._rng.random() < 0.2:
            replica_id = self._rng.choice(serving).replica_id
        yield (
            model_stream(model),
            ModelTuned(
                model=model,
                replica_id=replica_id,
                weight=round(self._rng.uniform(0.5, 2.0), 2),
                target_waiting=self._rng.randint(2, 16),
                kv_ceiling=round(self._rng.uniform(0.7, 0.95), 2),
                summary={"concurrency": self._rng.randint(4, 128), "p95_ttft_ms": 850.0},
            ),
        )

    def _take_serving(self, model: str | None = None) -> LiveReplica | None:
        if model is None:
            model = self._rng.choice(list(self._specs))
        serving = self._serving[model]
        if not serving:
            return None
        index = self._rng.randrange(len(serving))
        serving[index], serving[-1] = serving[-1], serving[index]
        return serving.pop()

    def _place(self, spec: ModelSpec) -> tuple[ShardPlacement, ...]:
        nodes = self._rng.sample(self._nodes, spec.shards_per_replica)
        shards = []
        for index, node in enumerate(nodes):
            first = self._rng.randrange(GPUS_PER_NODE // spec.gpus_per_shard) * spec.gpus_per_shard
            port = 20_000 + next(self._ports) % 1_000
            gpus = tuple(range(first, first + spec.gpus_per_shard))
            shards.append(ShardPlacement(index=index, node_id=node, gpus=gpus, port=port))
        return tuple(shards)

    # -- nodes, keys, audit --------------------------------------------------------------

    def _node_flap(self) -> Iterator[Step]:
        node = self._rng.choice(self._nodes)
        yield node_stream(node), NodeDisconnected(node_id=node, reason="heartbeat timeout")
        if self._rng.random() < 0.1:
            lost_after = self._rng.uniform(60, 600)
            yield node_stream(node), NodeLost(node_id=node, disconnected_for_s=lost_after)
        yield node_stream(node), self._connected(node)

    def _gpu_incident(self) -> Iterator[Step]:
        node = self._rng.choice(self._nodes)
        index = self._rng.randrange(GPUS_PER_NODE)
        gpu_uuid = self._gpu_uuids[node][index]
        xid = self._rng.choice(XIDS)
        yield (
            node_stream(node),
            GpuMarkedUnhealthy(
                node_id=node, gpu_index=index, gpu_uuid=gpu_uuid, reason=f"Xid {xid}", xid=xid
            ),
        )
        yield node_stream(node), GpuRecovered(node_id=node, gpu_index=index, gpu_uuid=gpu_uuid)

    def _cordon(self) -> Iterator[Step]:
        node = self._rng.choice(self._nodes)
        yield node_stream(node), NodeCordoned(node_id=node, reason="maintenance window")
        yield node_stream(node), NodeUncordoned(node_id=node)

    def _node_drain(self) -> Iterator[Step]:
        node = self._rng.choice(self._nodes)
        drain_id = f"drain-{self._hex()}"
        yield node_stream(node), NodeDrainRequested(node_id=node, drain_id=drain_id, grace_s=900)
        for _ in range(self._rng.randint(1, 4)):
            yield from self._rolling_move(drain_id)
        yield node_stream(node), NodeDrainFinished(node_id=node, drain_id=drain_id, outcome="done")
        yield node_stream(node), NodeUncordoned(node_id=node)

    def _key_change(self) -> Iterator[Step]:
        if self._keys and self._rng.random() < 0.3:
            key_id = self._keys.pop(self._rng.randrange(len(self._keys)))
            yield key_stream(key_id), ApiKeyRevoked(key_id=key_id)
        else:
            yield from self._create_key()

    def _create_key(self) -> Iterator[Step]:
        key_id = self._hex()
        self._keys.append(key_id)
        yield (
            key_stream(key_id),
            ApiKeyCreated(
                key_id=key_id,
                name=f"team-{key_id}",
                prefix=f"llmgw_{key_id}",
                secret_hash=f"{self._rng.getrandbits(256):064x}",
                models=tuple(self._rng.sample(list(self._specs), 2)),
                rpm=600,
            ),
        )

    def _audit_only(self) -> Iterator[Step]:
        node = self._rng.choice(self._nodes)
        model = self._rng.choice(list(self._specs))
        choice = self._rng.randrange(3)
        if choice == 0:
            yield (
                node_stream(node),
                IdentityRejected(
                    claimed_node_id=node,
                    certificate_subject="CN=gpu-9999",
                    remote_address=STRANGER,
                    reason="certificate names gpu-9999",
                ),
            )
        elif choice == 1:
            yield (
                node_stream(node),
                StrayStopped(
                    node_id=node,
                    replica_id=replica_id_for(model, 99_999),
                    shard_index=0,
                    model=model,
                    port=20_999,
                    rule="shard of a replica the log ended",
                ),
            )
        else:
            yield (
                model_stream(model),
                ModelUnplaceable(
                    model=model, reason="no node has 4 healthy free GPUs with 70 GiB each"
                ),
            )

    def _connected(self, node: str) -> NodeConnected:
        n = int(node.rpartition("-")[2]) - 1
        return NodeConnected(
            node_id=node,
            address=self._address(n),
            remote_address=f"{self._address(n)}:{self._rng.randrange(32_768, 61_000)}",
            labels=_labels(n),
            gpus=self._gpus(node),
            agent_version=AGENT_VERSION,
        )

    def _gpus(self, node: str) -> tuple[GpuInfo, ...]:
        return tuple(
            GpuInfo(
                index=index,
                uuid=f"GPU-{gpu_uuid}",
                name=GPU_NAME,
                memory_total_mib=GPU_MEMORY_MIB,
                memory_used_mib=self._rng.randrange(0, GPU_MEMORY_MIB, 512),
            )
            for index, gpu_uuid in enumerate(self._gpu_uuids[node])
        )

    def _hex(self) -> str:
        return f"{self._rng.getrandbits(40):010x}"

    def _address(self, n: int) -> str:
        return str(self._network[n + 1])


def _labels(n: int) -> dict[str, str]:
    return {"gpu": "h100", "zone": f"zone-{n % 4}", "rack": f"r{n // 40:02d}"}
