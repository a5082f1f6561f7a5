"""Commands the control plane sends to agents, and the engine command line of a shard.

Command ids are derived from what they act on, so sending one twice (after a reconnect,
or from a restarted control plane) is recognised by the agent as the same command."""

from __future__ import annotations

import shlex

import msgspec

from app.domain.model_spec import ModelSpec
from app.domain.state import ClusterState, Replica, Shard


class CommandNotSent(Exception):
    """Whoever carries commands to agents (the agent hub) could not send one."""


class NodeNotConnected(CommandNotSent):
    """The node has no live connection to this control plane; the next reconcile pass, after
    its agent said hello again, sends the command again."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"node {node_id!r} has no live agent connection")
        self.node_id = node_id


class Peer(msgspec.Struct, frozen=True, kw_only=True):
    shard_index: int
    address: str
    port: int


class StartShard(msgspec.Struct, frozen=True, kw_only=True):
    command_id: str
    replica_id: str
    shard_index: int
    model: str
    argv: tuple[str, ...]
    env: dict[str, str]
    gpus: tuple[int, ...]
    port: int
    peers: tuple[Peer, ...] = ()
    engine: str = "vllm"
    """The spec's engine: the agent probes, stops and explains the engine by its profile."""


class StopShard(msgspec.Struct, frozen=True, kw_only=True):
    command_id: str
    replica_id: str
    shard_index: int
    grace_s: float


def start_command(
    state: ClusterState, spec: ModelSpec, replica: Replica, shard: Shard
) -> StartShard:
    peers = tuple(
        Peer(shard_index=s.index, address=_address(state, s.node_id), port=s.port)
        for s in replica.shards
        if s.index != shard.index
    )
    return StartShard(
        command_id=start_command_id(replica.id, shard.index),
        replica_id=replica.id,
        shard_index=shard.index,
        model=spec.name,
        argv=render_argv(spec, state, replica, shard),
        env=dict(spec.env),
        gpus=shard.gpus,
        port=shard.port,
        peers=peers,
        engine=spec.engine,
    )


def start_command_id(replica_id: str, shard_index: int) -> str:
    """The id of every start of the shard: an agent told it again knows it for the same."""
    return f"start-{replica_id}-{shard_index}"


def stop_command(replica_id: str, shard_index: int, grace_s: float) -> StopShard:
    return StopShard(
        command_id=f"stop-{replica_id}-{shard_index}",
        replica_id=replica_id,
        shard_index=shard_index,
        grace_s=grace_s,
    )


def stray_stop_command(
    replica_id: str, shard_index: int, pid: int | None, grace_s: float
) -> StopShard:
    return StopShard(
        command_id=f"stray-{replica_id}-{shard_index}-{pid}",
        replica_id=replica_id,
        shard_index=shard_index,
        grace_s=grace_s,
    )


def render_argv(
    spec: ModelSpec, state: ClusterState, replica: Replica, shard: Shard
) -> tuple[str, ...]:
    """The model's command template with this shard's values (see COMMAND_PLACEHOLDERS)."""
    leader = replica.shards[0]
    values = {
        "model": spec.name,
        "port": str(shard.port),
        "host": _address(state, shard.node_id),
        "gpus": ",".join(map(str, shard.gpus)),
        "gpu_count": str(len(shard.gpus)),
        "rank": str(shard.index),
        "world_size": str(len(replica.shards)),
        "peers": ",".join(
            f"{_address(state, s.node_id)}:{s.port}" for s in replica.shards if s is not shard
        ),
        "leader": f"{_address(state, leader.node_id)}:{leader.port}",
    }
    # Split, then fill in: a value is always one word (an address with a space or a quote
    # in it cannot add arguments), and the split reads the short template, not what a
    # placeholder such as {peers} fills in to.
    return tuple(word.format(**values) for word in shlex.split(spec.command))


def _address(state: ClusterState, node_id: str) -> str:
    node = state.nodes.get(node_id)
    return node.address if node is not None else node_id
