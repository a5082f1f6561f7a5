"""A running engine as the supervisor holds it: its record, its process and the tasks that
watch it.

Apart from the modules that use it because three of them do: watching
(``agent.engines.watching``) fills it in, stopping (``agent.engines.stopping``) ends what
it holds, and the inventory (``agent.engines.inventory``) lists it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from agent.engines.oom import OomCounts
from agent.engines.processes import EngineProcess
from agent.engines.records import ShardRecord


@dataclass(eq=False)
class Watched:
    record: ShardRecord
    process: EngineProcess
    exit: asyncio.Task[int | None]
    monitor: asyncio.Task[None] | None = None
    stopping: bool = False
    refusal: str | None = None
    """Why the supervisor ended the engine itself (its port is another process's, or it
    stopped answering its health checks)."""
    port_held_elsewhere: bool = False
    """Whether a process that is not this engine was found listening on its port: the
    control plane avoids that port of this node (``wire.ShardStatus.port_held_elsewhere``)."""
    oom_at_start: OomCounts | None = None
    """The OOM kills counted when this agent spawned the engine (``agent.engines.oom``);
    None for an engine adopted, whose exit status is unknown anyway."""
