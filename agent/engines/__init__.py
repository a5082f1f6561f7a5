"""Engine supervision for the node agent.

``EngineSupervisor`` starts engine processes on the control plane's ``start_shard``, stops
them on ``stop_shard``, reports each state change, and re-attaches running engines when
the agent starts again. Engines outlive the agent: they run in their own sessions, write
their own logs, and are found again through records in the agent's state directory.

Exceptions::

    EngineError
     ├── EngineLaunchError    no engine process could be started
     ├── PortHeldElsewhere    another process listens on the engine's port
     └── ShardRunsOtherwise   a start for a shard that runs on another port or GPUs
"""

from agent.engines.changes import ShardChange
from agent.engines.errors import (
    EngineError,
    EngineLaunchError,
    PortHeldElsewhere,
    ShardRunsOtherwise,
)
from agent.engines.records import ShardKey, ShardRecord, ShardState
from agent.engines.spec import ShardSpec
from agent.engines.supervisor import EngineSupervisor

__all__ = [
    "EngineError",
    "EngineLaunchError",
    "EngineSupervisor",
    "PortHeldElsewhere",
    "ShardChange",
    "ShardKey",
    "ShardRecord",
    "ShardRunsOtherwise",
    "ShardSpec",
    "ShardState",
]
