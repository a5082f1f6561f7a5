"""A TCP relay on 127.0.0.1 in front of a real server, which a test can cut and mend: the
network between one process and PostgreSQL failing, the others still reaching it.

While cut, every connection through the relay stays open and carries nothing either way,
as a partition leaves them (no reset, no close: the process finds out only by its own
timeouts), and a new connection is accepted and carries nothing either. Refusing, every new
connection is closed at once, as a server that is down or restarting closes them. Losing
answers, each request is carried to the server and the client's connection is closed as its
answer starts, without it: the request was done, and the client cannot know. Mended, what
was held flows on and new connections are carried. It runs on the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from types import TracebackType

from app.store.database_url import parse_database_url

CHUNK_BYTES = 65536


class TcpRelay:
    """``async with TcpRelay(host, port) as relay``: connect to ``relay.port`` to reach
    ``host``:``port``."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._open = asyncio.Event()
        self._open.set()
        self._refusing = False
        self._losing_answers = False
        self._pipes: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def in_front_of(self, database_url: str) -> str:
        """``database_url`` (of the server this relay reaches) with its one host replaced by
        the relay."""
        url = parse_database_url(database_url)
        return dataclasses.replace(url, hosts=(("127.0.0.1", self.port),)).libpq()

    def cut(self) -> None:
        """Carry nothing from now on, in either direction, on any connection."""
        self._open.clear()

    def refuse(self) -> None:
        """Close every new connection at once from now on (those open are left as they are)."""
        self._refusing = True

    def lose_answers(self) -> None:
        """From now on, carry requests to the server and close the client's connection as the
        server's answer starts, without it."""
        self._losing_answers = True

    def mend(self) -> None:
        """Carry again, what was held first, and carry new connections."""
        self._refusing = False
        self._losing_answers = False
        self._open.set()

    async def _relay(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        if self._refusing:
            client_out.close()
            return
        await self._open.wait()
        try:
            server_in, server_out = await asyncio.open_connection(*self._target)
        except OSError:
            client_out.close()
            return
        for reader, writer, answers in (
            (client_in, server_out, False),
            (server_in, client_out, True),
        ):
            pipe = asyncio.create_task(self._pipe(reader, writer, answers=answers))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, answers: bool
    ) -> None:
        """``answers``: the server's side, to the client."""
        try:
            while data := await reader.read(CHUNK_BYTES):
                await self._open.wait()
                if answers and self._losing_answers:
                    return
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()
