"""The variables the agent sets in every engine's environment itself, over whatever a model
spec's ``env`` says, and why.

It lives in ``wire`` because the agent may import nothing of the server's domain
(``tests/unit/test_layers.py``): the agent builds each engine's environment from these names
(``agent.engines.spec.engine_env``, the supervisor's launch token). The model spec, in the
pure domain, which imports no ``wire``, refuses a spec that sets one, from its own copy of
this table, kept equal to it by a test (``tests/unit/test_model_spec.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

GPUS_VARIABLE = "CUDA_VISIBLE_DEVICES"
PORT_VARIABLE = "PORT"
LAUNCH_TOKEN_VARIABLE = "LLMGW_ENGINE_LAUNCH"
"""Set to its ``LaunchRecord``'s token: what finds the engine again after an agent restart."""

AGENT_SET_VARIABLES: Mapping[str, str] = MappingProxyType(
    {
        GPUS_VARIABLE: "set by the agent from the GPUs it assigns",
        PORT_VARIABLE: "set by the agent to the port it assigns",
        LAUNCH_TOKEN_VARIABLE: "set by the agent to find its engine again after a restart",
    }
)
"""Each variable the agent sets, and why, in the words a refused spec is answered with."""
