"""Where a relayed stream's server-sent events end: a stream cut short is cut between events.

The relay passes an engine's stream on as it comes, unparsed (``app.gateway.proxy``). An
engine that dies in the middle of an event would leave the client half of it, and the error
event the gateway ends the stream with would be read as the rest of that event: one line of
broken JSON (the ``openai`` SDK raises a ``JSONDecodeError``), the error lost. So what
follows a piece's last complete event is held back until the event's end comes, and dropped
if the stream breaks off first.

An engine writes each event whole, and mostly in one piece: then nothing is held, and a
piece costs one ``endswith``. An event ends at a blank line: two line ends in a row, each
``\\n``, ``\\r\\n`` or ``\\r``. At most ``MAX_HELD_BYTES`` are held: past them what came goes
on, and a stream that breaks off before the next event's end is cut where it broke, as
before. So goes an event too long to hold, and an answer that is no event stream (a JSON
answer to a streamed request, which goes whole at its end when it is shorter).
"""

from __future__ import annotations

MAX_HELD_BYTES = 256 << 10
"""The most of an unfinished event held back: events are a few hundred bytes."""

_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")
"""How a piece that ends with a whole event ends, in the line ends one engine uses."""
_BLANK_LINES = (b"\n\n", b"\r\r", b"\n\r\n", b"\n\r")
"""Where an event may end, mixed line ends included (``\\n\\r`` may be the first half of
``\\n\\r\\n``: cut there, the ``\\n`` goes with the next event, and a client reads the
same)."""
_LONGEST = max(map(len, _BLANK_LINES))


class WholeEvents:
    """What of a stream may go to the client: its pieces, up to their last whole event."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = bytearray()

    def cut(self, piece: bytes) -> bytes:
        """What of the stream goes now that ``piece`` came: up to its last event's end."""
        held = self._held
        if not held and piece.endswith(_ENDS):
            return piece
        # A blank line may begin in what was held already, and end in ``piece``.
        start = max(0, len(held) - _LONGEST + 1)
        held += piece
        end = 0
        for blank in _BLANK_LINES:
            at = held.rfind(blank, start)
            if at >= 0:
                end = max(end, at + len(blank))
        if end == 0:
            if len(held) <= MAX_HELD_BYTES:
                return b""
            end = len(held)  # an event too long to hold, or no event stream at all
        sent = bytes(held[:end])
        del held[:end]
        return sent

    def rest(self, piece: bytes = b"") -> bytes:
        """The stream ended (whole, as the engine ended it) with ``piece``: all of what is
        left goes."""
        if not self._held:
            return piece
        sent = bytes(self._held) + piece
        self._held.clear()
        return sent

    def drop(self) -> None:
        """The stream broke off: the unfinished event it held never goes."""
        self._held.clear()
