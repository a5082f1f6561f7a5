"""A TCP relay on 127.0.0.1 in front of a real server, which a test can cut and mend: the
network between one process and PostgreSQL failing, the others still reaching it.

While cut, every connection through the relay stays open and carries nothing either way,
as a partition leaves them (no reset, no close: the process finds out only by its own
timeouts), and a new connection is accepted and carries nothing either. Refusing, every new
connection is closed at once, as a server that is down or restarting closes them. Losing
answers, each request is carried to the server and the client's connection is closed as its
answer starts, without it: the request was done, and the client cannot know;
``lose_next_answer()`` loses only the next one so (plain HTTP: the first the server says on
a connection is its answer). Mended, what was held flows on and new connections are
carried. It runs on the test's event loop.

``lose_one_tls_answer()`` does the same over TLS 1.3, to one connection: the client
speaks (its hello), the server answers (its whole part of the handshake), the client
speaks again (the end of the handshake, and its request), and what the server says after
that (its answer) is lost. The server must send no session ticket (its context's
``num_tickets`` 0), or the tickets it sends at the end of the handshake would be taken for
its answer, and the request cut off before it reached the server. The connections after it
are carried.

``break_after_sending(marker)`` breaks one connection at the worst moment of a statement:
once the client has sent everything that runs it (the Bind, Execute and Sync of the prepared
statement whose text holds ``marker``: asyncpg prepares a statement once per connection and
then sends only its name; or the simple query holding it, as asyncpg sends ``COMMIT;``), so
PostgreSQL runs and commits it, but its answer never reaches the client. The connection is
then held (as ``cut`` holds them all) or reset; or reset without sending the statement
(``Break.LOST``), which the client cannot tell apart."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct
from collections.abc import AsyncIterator
from enum import Enum
from types import TracebackType

import pytest_asyncio

from app.store.database_url import parse_database_url

CHUNK_BYTES = 65536
_UNTYPED_REQUESTS = (80877103, 80877104)
"""SSLRequest and GSSENCRequest: untyped, and another untyped message (the startup) follows."""


class Break(Enum):
    HOLD = "hold"
    """Carry nothing more either way, the connection left open (a partition)."""
    RESET = "reset"
    """Close both sides (the server restarted, a firewall's reset)."""
    LOST = "lost"
    """Close both sides without sending what carries the statement: it never reaches the
    server, and the client cannot tell that from ``RESET``."""


@dataclasses.dataclass
class _Armed:
    marker: bytes
    how: Break
    broken: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class _ClientMessages:
    """The client's side of one PostgreSQL connection, read message by message, which says
    where the statement an ``_Armed`` waits for has been sent in full."""

    def __init__(self) -> None:
        self._buffer = b""
        self._typed = False
        self._statements: dict[bytes, bytes] = {}
        """Every statement the client prepared, by name, and its text."""
        self._bound = False

    def feed(self, data: bytes, marker: bytes | None) -> int | None:
        """How many bytes of ``data`` to send before the break (all of the Sync after a Bind
        of a statement naming ``marker``, or of a simple query naming it, as ``COMMIT;``), or
        None when it is not in ``data``."""
        start = len(self._buffer)
        self._buffer += data
        offset = 0
        while True:
            header = 8 if not self._typed else 5
            if len(self._buffer) - offset < header:
                break
            if self._typed:
                kind = self._buffer[offset : offset + 1]
                (length,) = struct.unpack_from(">i", self._buffer, offset + 1)
                size = 1 + length
            else:
                kind = b""
                length, code = struct.unpack_from(">ii", self._buffer, offset)
                size = length
            if len(self._buffer) - offset < size:
                break
            body = self._buffer[offset + header : offset + size]
            offset += size
            if not self._typed:
                self._typed = code not in _UNTYPED_REQUESTS
            elif kind == b"P":
                name, _, rest = body.partition(b"\0")
                self._statements[name] = rest.partition(b"\0")[0]
            elif kind == b"B":
                statement = body.partition(b"\0")[2].partition(b"\0")[0]
                text = self._statements.get(statement, b"")
                self._bound = marker is not None and marker in text
            elif (kind == b"S" and self._bound) or (
                kind == b"Q" and marker is not None and marker in body
            ):
                self._buffer = b""
                return max(0, offset - start)
        self._buffer = self._buffer[offset:]
        return None


@dataclasses.dataclass
class _Connection:
    """One connection through the relay, as its two pipes share it."""

    server_spoke: bool = False
    losing_answer: bool = False


class TcpRelay:
    """``async with TcpRelay(host, port) as relay``: connect to ``relay.port`` to reach
    ``host``:``port``."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._open = asyncio.Event()
        self._open.set()
        self._refusing = False
        self._losing_answers = False
        self._tls_answers_to_lose = 0
        self._answers_to_lose = 0
        self._armed: _Armed | None = None
        self._held: set[asyncio.Event] = set()
        """Connections held after a break, until ``mend``."""
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

    def lose_next_answer(self) -> None:
        """Carry the next plain HTTP request to the server and close the client's connection
        as its answer starts, without it; carry the connections after it."""
        self._answers_to_lose = 1

    def lose_one_tls_answer(self) -> None:
        """Carry the next TLS connection's handshake and request to the server, and close
        the client's connection as the answer to the request starts, without it (from a
        server that sends no session ticket: see the module docstring)."""
        self._tls_answers_to_lose = 1

    def break_after_sending(self, marker: bytes, how: Break) -> asyncio.Event:
        """Break the first connection that sends the statement whose text holds ``marker``
        (see the module docstring), the others carried on; the event is set once it is
        broken. A held connection flows again with ``mend``."""
        self._armed = _Armed(marker, how)
        return self._armed.broken

    def mend(self) -> None:
        """Carry again, what was held first, and carry new connections."""
        self._refusing = False
        self._losing_answers = False
        self._tls_answers_to_lose = 0
        self._answers_to_lose = 0
        self._open.set()
        for held in self._held:
            held.set()
        self._held.clear()

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
        held = asyncio.Event()
        held.set()
        ends = (client_out, server_out)
        connection = _Connection()
        for reader, writer, messages in (
            (client_in, server_out, _ClientMessages()),
            (server_in, client_out, None),
        ):
            pipe = asyncio.create_task(self._pipe(reader, writer, messages, held, ends, connection))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        messages: _ClientMessages | None,
        held: asyncio.Event,
        ends: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        connection: _Connection,
    ) -> None:
        """Carry ``reader`` to ``writer``; ``messages`` watches the client's side for the
        armed statement, and ``held`` (the connection's own) stops both sides once it is
        sent."""
        try:
            while data := await reader.read(CHUNK_BYTES):
                await self._open.wait()
                await held.wait()
                if messages is None and not connection.server_spoke and self._answers_to_lose > 0:
                    self._answers_to_lose -= 1
                    connection.losing_answer = True
                if messages is None and (self._losing_answers or connection.losing_answer):
                    return  # the server's answer, to the client
                if messages is None:
                    connection.server_spoke = True
                elif self._tls_answers_to_lose > 0 and connection.server_spoke:
                    self._tls_answers_to_lose -= 1
                    connection.losing_answer = True  # before the server can answer it
                armed = self._armed
                sent = None
                if messages is not None:
                    sent = messages.feed(data, armed.marker if armed is not None else None)
                if sent is None or armed is None:
                    writer.write(data)
                    await writer.drain()
                    continue
                self._armed = None
                if armed.how is not Break.LOST:
                    writer.write(data[:sent])
                    await writer.drain()
                armed.broken.set()
                if armed.how is not Break.HOLD:
                    for end in ends:
                        end.close()
                    return
                held.clear()
                self._held.add(held)
                await held.wait()
                writer.write(data[sent:])
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()


@pytest_asyncio.fixture(loop_scope="session")
async def relay(database_url: str) -> AsyncIterator[TcpRelay]:
    """A relay in front of the test's PostgreSQL (``database_url``'s host and port)."""
    (host, port), *_ = parse_database_url(database_url).hosts
    assert port is not None
    async with TcpRelay(host, port) as relay:
        yield relay
