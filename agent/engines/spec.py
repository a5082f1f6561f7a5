"""What the control plane asks the agent to run, and the environment an engine gets."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from agent.engines.readiness import readiness_url
from agent.engines.records import ShardKey
from wire.engine_env import GPUS_VARIABLE, PORT_VARIABLE
from wire.engines import DEFAULT_ENGINE


class ShardSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One shard to start. ``argv`` is already rendered; ``port`` is where it must listen."""

    replica_id: str
    shard_index: int
    model: str
    argv: tuple[str, ...]
    env: dict[str, str] = {}
    gpus: tuple[int, ...] = ()
    port: int
    engine: str = DEFAULT_ENGINE
    """The engine's profile name (``wire.engines``)."""

    @property
    def key(self) -> ShardKey:
        return ShardKey(self.replica_id, self.shard_index)

    @property
    def readiness_url(self) -> str:
        return readiness_url(self.port)


def engine_env(base: Mapping[str, str], spec: ShardSpec) -> dict[str, str]:
    """``base`` (the agent's environment) overlaid with the spec's variables, then with the
    GPUs and port the agent assigned, which nothing may override (a spec that sets them is
    refused by the control plane: ``wire.engine_env``)."""
    return {
        **base,
        **spec.env,
        GPUS_VARIABLE: ",".join(str(gpu) for gpu in spec.gpus),
        PORT_VARIABLE: str(spec.port),
    }
