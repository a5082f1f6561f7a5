"""An engine that answers with whatever bytes a test scripts: a TCP server on 127.0.0.1, one
thread per connection, speaking just enough HTTP/1.1 to read requests.

    def story(request: bytes) -> Iterable[bytes]:
        yield b"HTTP/1.1 200 OK\\r\\n"
        yield b"x-endless: " + b"a" * (1 << 20)        # and never ends its head

    with BadEngine(story) as engine:
        route = Route(replica_id="bad-1", model=MODEL, url=engine.url)

What ``story`` yields is written piece by piece; then the connection waits for the next
request, as a kept-alive one does. ``GET /metrics`` is answered by ``metrics`` (404 by
default, as an engine without an exporter does); a story that yields ``HANG_UP`` has its
connection closed there. ``closed_after_post`` counts connections that carried a POST and
that the gateway (or a story's ``HANG_UP``) closed: how a test sees the gateway drop an
engine's connection.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

Story = Callable[[bytes], Iterable[bytes]]

NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
HANG_UP = b"(hang up)"
"""Yielded by a story (this very object): the engine closes the connection there, mid-answer
as a crashed one does."""


def json_answer(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


def sse_answer(*events: bytes) -> bytes:
    """A chunked stream of ``data:`` events, ending with ``data: [DONE]``."""
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(event), event)
        for event in (*(b"data: %s\n\n" % e for e in events), b"data: [DONE]\n\n")
    )
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
    return head + b"\r\n\r\n" + chunks + b"0\r\n\r\n"


PAGE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n"
"""A ``/metrics`` answer's head, but for how its length is told and the blank line."""
GAUGE = b"vllm:num_requests_waiting 0.0\n"


class Sent:
    """What a story wrote so far."""

    def __init__(self) -> None:
        self.bytes = 0

    def counted(self, pieces: Iterable[bytes]) -> Iterator[bytes]:
        for piece in pieces:
            yield piece
            self.bytes += len(piece)


def endless_page(sent: Sent, *, up_to: int = 64 << 20) -> Story:
    """A page of chunks, a MiB each, sent as fast as they are read: ``up_to`` bytes, then
    nothing more and no end (enough to tell a bound from none, without filling memory)."""
    return _endless(sent, PAGE_HEAD, GAUGE, b"# filler\n", up_to)


MODELS_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
"""A ``GET /v1/models`` answer's head, but for how its length is told and the blank line."""


def endless_model_list(sent: Sent, *, up_to: int = 16 << 20) -> Story:
    """An OpenAI model list that never closes: ``{"object":"list","data":[`` and model
    cards, a MiB a chunk, ``up_to`` bytes, then nothing more and no end."""
    return _endless(sent, MODELS_HEAD, b'{"object":"list","data":[', b'{"id":"m"},', up_to)


def _endless(sent: Sent, head: bytes, first: bytes, filler: bytes, up_to: int) -> Story:
    chunk = filler * ((1 << 20) // len(filler))
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)

    def story(request: bytes) -> Iterable[bytes]:
        def pieces() -> Iterator[bytes]:
            yield (
                head
                + b"transfer-encoding: chunked\r\n\r\n"
                + b"%x\r\n%s\r\n"
                % (
                    len(first),
                    first,
                )
            )
            for _ in range(up_to // len(chunk)):
                yield framed

        return sent.counted(pieces())

    return story


class BadEngine:
    def __init__(self, story: Story, metrics: Story = lambda request: [NOT_FOUND]) -> None:
        self._story = story
        self._metrics = metrics
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self._closed = threading.Condition(self._lock)
        self.posts: list[bytes] = []
        self.closed_after_post = 0
        self._threads: list[threading.Thread] = []
        self._stopping = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def wait_closed_after_post(self, count: int = 1, within_s: float = 10.0) -> None:
        """Until the gateway has closed ``count`` connections that carried a POST."""
        with self._closed:
            if not self._closed.wait_for(lambda: self.closed_after_post >= count, within_s):
                raise AssertionError(
                    f"the gateway closed {self.closed_after_post} POST connections, "
                    f"not {count}, within {within_s} s"
                )

    def __enter__(self) -> BadEngine:
        acceptor = threading.Thread(target=self._accept, name="bad-engine", daemon=True)
        acceptor.start()
        self._threads.append(acceptor)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stopping = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(
                target=self._serve, args=(connection,), name="bad-engine-conn", daemon=True
            )
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        posted = False
        buffered = b""
        with connection:
            try:
                while True:
                    request, buffered = _read_request(connection, buffered)
                    if request is None:
                        break
                    if request.startswith(b"GET /metrics "):
                        pieces = self._metrics(request)
                    else:
                        posted = True
                        with self._lock:
                            self.posts.append(request)
                        pieces = self._story(request)
                    if not _write(connection, pieces):
                        break
            except OSError:
                pass  # reset by the gateway: closed all the same
        if posted:
            with self._closed:
                self.closed_after_post += 1
                self._closed.notify_all()


def _write(connection: socket.socket, pieces: Iterable[bytes]) -> bool:
    """Write ``pieces``; whether the connection stays open (the story did not hang up)."""
    for piece in pieces:
        if piece is HANG_UP:
            return False
        connection.sendall(piece)
    return True


def _read_request(connection: socket.socket, buffered: bytes) -> tuple[bytes | None, bytes]:
    """One request (head and body) and what came after it; ``None`` once the peer closed."""
    while b"\r\n\r\n" not in buffered:
        data = connection.recv(65536)
        if not data:
            return None, b""
        buffered += data
    head, _, rest = buffered.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        data = connection.recv(65536)
        if not data:
            return None, b""
        rest += data
    return head + b"\r\n\r\n" + rest[:length], rest[length:]
