"""ASGI's lifespan protocol, from the server's side: the app's startup before the listener
takes a connection, its shutdown after the last one.

    lifespan = Lifespan(app)
    await lifespan.startup()     # raises LifespanFailed if the app says so, or fails
    ...
    await lifespan.shutdown()
"""

from __future__ import annotations

import asyncio
import contextlib

from wire.asgi import App, Message

_SCOPE = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}


class LifespanFailed(RuntimeError):
    """The app did not complete its startup (or shutdown)."""


class Lifespan:
    def __init__(self, app: App) -> None:
        self._app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._replies: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lifespan")
        await self._ask("startup")

    async def _run(self) -> None:
        await self._app(dict(_SCOPE), self._inbox.get, self._replies.put)

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        try:
            await self._ask("shutdown")
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _ask(self, what: str) -> None:
        assert self._task is not None
        await self._inbox.put({"type": f"lifespan.{what}"})
        reply = asyncio.ensure_future(self._replies.get())
        await asyncio.wait({reply, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():
            reply.cancel()
            failure = None if self._task.cancelled() else self._task.exception()
            raise LifespanFailed(f"the app ended during its lifespan {what}") from failure
        message = reply.result()
        if message["type"] != f"lifespan.{what}.complete":
            raise LifespanFailed(f"the app's lifespan {what} failed: {message.get('message', '')}")
