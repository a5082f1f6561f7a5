"""An engine's answer as the engine client hands it over (``app.gateway.engine_client``):
its status and content type once its head is in, then its body, piece by piece
(``chunks``) or whole (``read``: at most ``MAX_ANSWER_BYTES``, ``MAX_ERROR_BYTES`` for an
error answer). Pieces not taken yet are buffered: past ``HIGH_WATER_BYTES`` the connection
stops reading from the engine, until they are down to ``LOW_WATER_BYTES``.

Two sides use it. The client awaits ``head_arrival``, then hands the answer over, to be read
(``read``, ``chunks``) and closed. The connection fills it in as the engine sends it: the
declared length and content type, then ``started``, ``received`` for each piece of body,
and ``finished`` or ``failed`` (``AnswerSink`` in ``app.gateway.engine_connection``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, NoReturn

from app.gateway.engine_bounds import MAX_ANSWER_BYTES, MAX_ERROR_BYTES
from app.gateway.engine_errors import AnswerTooLarge, EngineUnreachable, HeadTimedOut

if TYPE_CHECKING:
    from app.gateway.engine_connection import EngineConnection

HIGH_WATER_BYTES = 1 << 20
"""Stop reading from the engine while this much of its answer waits for the client."""
LOW_WATER_BYTES = 1 << 18


class EngineAnswer:
    """An engine's answer whose head has arrived; its body is read as it comes."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_connection",
        "_done",
        "_error",
        "_waiter",
        "content_type",
        "declared_length",
        "head_arrival",
        "status",
    )

    def __init__(self, connection: EngineConnection) -> None:
        self.status = 0
        self.content_type = b""
        self._connection: EngineConnection | None = connection
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._done = False
        self._error: BaseException | None = None
        self.head_arrival: asyncio.Future[None] = connection.loop.create_future()
        """Done once the head is in (``started``); failed with ``EngineUnreachable`` or
        ``HeadTimedOut`` when none came. The client awaits it; only the connection ends it."""
        self.declared_length = -1
        """The body's declared length (``content-length``); -1: none."""
        self._waiter: asyncio.Future[None] | None = None

    async def read(self) -> bytes:
        """The whole body; ``AnswerTooLarge`` (and the connection closed) past
        ``MAX_ANSWER_BYTES`` (``MAX_ERROR_BYTES`` for an error answer), at once when its
        declared length says so."""
        limit = MAX_ANSWER_BYTES if self.status < 400 else MAX_ERROR_BYTES
        if self.declared_length > limit:
            self._too_large(limit, f"declares {self.declared_length} bytes")
        parts = []
        size = 0
        while (chunk := await self._next()) is not None:
            size += len(chunk)
            if size > limit:
                self._too_large(limit, "goes on past it")
            parts.append(chunk)
        return b"".join(parts)

    def _too_large(self, limit: int, how: str) -> NoReturn:
        self.close()
        what = "answer" if limit == MAX_ANSWER_BYTES else f"error answer (HTTP {self.status})"
        raise AnswerTooLarge(
            f"the engine's {what} is over {limit >> 20} MiB, the most the gateway "
            f"reads whole (it {how})"
        )

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's pieces, as the engine sends them."""
        while True:
            chunk = await self._next()
            if chunk is None:
                return
            yield chunk

    @property
    def ended(self) -> bool:
        """Whether the body is all read and handed over: the next piece is none."""
        return self._done and not self._chunks

    async def _next(self) -> bytes | None:
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                connection = self._connection
                if connection is not None and self._buffered <= LOW_WATER_BYTES:
                    connection.resume()
                return chunk
            if self._done:
                return None
            if self._error is not None:
                raise self._error
            self._waiter = self.head_arrival.get_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        """Done with the answer: an unfinished one's connection is closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.abandon()

    # -- called by the connection (``AnswerSink``) ---------------------------------------------

    def started(self, status: int) -> None:
        """The head is in, with ``status``: ``head_arrival`` is done."""
        self.status = status
        if not self.head_arrival.done():
            self.head_arrival.set_result(None)

    def received(self, chunk: bytes) -> None:
        """A piece of the body, buffered for the reader; past ``HIGH_WATER_BYTES`` buffered
        the connection is paused."""
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > HIGH_WATER_BYTES and self._connection is not None:
            self._connection.pause()
        self._wake()

    def finished(self) -> None:
        """The body is all in."""
        self._done = True
        self._connection = None
        self._wake()

    def failed(self, error: BaseException) -> None:
        """The answer broke off with ``error``: before its head, ``head_arrival`` fails
        (with ``EngineUnreachable`` unless it is one, or ``HeadTimedOut``); the reader gets
        ``error`` once the pieces before it are read."""
        self._connection = None
        if not self.head_arrival.done():
            unreachable = (
                error
                if isinstance(error, (EngineUnreachable, HeadTimedOut))
                else EngineUnreachable(str(error))
            )
            self.head_arrival.set_exception(unreachable)
            # Nobody may await the head any more (a cancelled request): no warning for it.
            self.head_arrival.exception()
        self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
