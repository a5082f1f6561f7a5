"""ASGI as llmgw's two HTTP applications speak it: the types of its messages and calls, and
the application's side of the lifespan protocol.

The gateway (``app.gateway.app``, run by its own server, ``app.listeners``) and the engine
simulator (``agent.simulator.http_app``, run by uvicorn) are both ASGI applications; what
they share of it lives here because ``wire`` is the one package both may import
(``tests/unit/test_layers.py``).

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send, startup=self._start, shutdown=self._stop)
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


async def serve_lifespan(
    receive: Receive,
    send: Send,
    *,
    startup: Callable[[], Awaitable[None]],
    shutdown: Callable[[], Awaitable[None]],
) -> None:
    """Answer the server's lifespan messages: ``startup`` before saying the startup is
    complete, ``shutdown`` before saying the shutdown is; return after the shutdown. An
    error either raises is left to end the lifespan (the server says the app failed)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
