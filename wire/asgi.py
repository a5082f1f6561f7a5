"""ASGI as llmgw's two HTTP applications speak it: the types of its messages and calls.

The gateway (``app.gateway.app``, run by its own server, ``app.listeners``) and the engine
simulator (``agent.simulator.http_app``, run by uvicorn) are both ASGI applications; what
they share of it lives here because ``wire`` is the one package both may import
(``tests/unit/test_layers.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

# ASGI messages are dictionaries whose value types depend on their "type" key.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
