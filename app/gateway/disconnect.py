"""A client that disconnects cancels its request (``DisconnectWatch``): the request's task
is cancelled wherever it is (waiting for a grant of its key's limits, queued for a replica,
waiting for the engine's first byte, or mid-stream) when the client goes; closing the
upstream connection is what tells the engine to abort. The listeners' server says so by a
callback (``ON_DISCONNECT``), which costs no task; under another ASGI server a watcher task
waits for ``http.disconnect`` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from app.gateway.asgi import Receive, Scope
from app.listeners.exchange import ON_DISCONNECT


def disconnect_listener(scope: Scope) -> Callable[[Callable[[], None]], None] | None:
    """The server's ``ON_DISCONNECT`` extension, where it has one: it calls back when the
    client leaves, without taking the request's body messages."""
    extensions = scope.get("extensions")
    return extensions.get(ON_DISCONNECT) if extensions else None


class DisconnectWatch:
    """Cancels the request's task when its client disconnects, from ``start`` until
    ``done``: while it waits for a grant of its key's limits, for a replica (in the queue,
    or held for a cold start), or for the engine's answer, and while it relays it."""

    __slots__ = ("done", "fired", "task", "watcher")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.done = False
        self.fired = False
        self.watcher: asyncio.Task[None] | None = None
        """The task that waits for ``http.disconnect``, where the server has no callback."""

    def start(self, scope: Scope, receive: Receive) -> None:
        """Watch from now on: by the server's callback where it has one (no task), else by
        a task that waits for ``http.disconnect`` (so only once the body is all read)."""
        on_disconnect = disconnect_listener(scope)
        if on_disconnect is not None:
            on_disconnect(self.fire)
            return
        # The task's own loop: asyncio's get_running_loop() costs a system call (getpid).
        self.watcher = self.task.get_loop().create_task(self.run(receive))

    def stop(self) -> None:
        """The request is answered, or being refused: its client leaving cancels nothing
        from now on."""
        self.done = True
        if self.watcher is not None:
            self.watcher.cancel()

    def left(self) -> bool:
        """Whether the request's task was cancelled because its client left, and for no
        other reason (the gateway stopping); if so the cancellation is taken back, so that
        the request ends quietly (499)."""
        return self.fired and self.task.uncancel() == 0

    def fire(self) -> None:
        """The client is gone: cancel the request, unless its answer is done."""
        # After the answer's last byte, ``receive`` says http.disconnect too: not a cancel.
        if not self.done:
            self.fired = True
            self.task.cancel()

    async def run(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.fire()
