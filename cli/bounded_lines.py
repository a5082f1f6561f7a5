"""A streamed answer cut into lines, a record at a time bounded in size: no socket here,
bytes in and lines out.

A record is the lines up to a blank one, as a ``text/event-stream`` sends each event.
However long the stream, no more than one record is held: a server that sends one without
end (a line that never breaks, or lines that are never followed by a blank one) is refused
once it passes the bound, not buffered.
"""

from __future__ import annotations

import re

_LINE_END = re.compile(rb"\r\n|\r|\n")


class RecordTooLarge(Exception):
    """A record grew past the bound before it ended."""


class BoundedLines:
    """Feed it the answer's bytes as they come; it returns each complete line (without its
    line break: CRLF, LF or CR, as event streams allow) and raises ``RecordTooLarge`` when
    the record being read passes ``max_record_bytes``."""

    def __init__(self, max_record_bytes: int) -> None:
        self._max = max_record_bytes
        self._pending = bytearray()
        self._record = 0
        """Bytes of the complete lines of the record being read."""

    def feed(self, chunk: bytes) -> list[str]:
        # What was pending holds no line break but perhaps a last CR: only that and the
        # new bytes are searched, so a long line costs its length once, not once a chunk.
        searched = max(0, len(self._pending) - 1)
        self._pending += chunk
        lines: list[str] = []
        start = 0
        for end in _LINE_END.finditer(self._pending, searched):
            if end.group() == b"\r" and end.end() == len(self._pending):
                break  # perhaps the first half of a CRLF: wait for the next byte
            line = bytes(self._pending[start : end.start()])
            self._record = 0 if not line else self._record + len(line)
            self._check(0)
            lines.append(line.decode(errors="replace"))
            start = end.end()
        del self._pending[:start]
        self._check(len(self._pending))
        return lines

    def finish(self) -> list[str]:
        """The last line, when the answer ended without a line break after it."""
        rest = bytes(self._pending.removesuffix(b"\r"))
        self._pending.clear()
        return [rest.decode(errors="replace")] if rest else []

    def _check(self, unfinished: int) -> None:
        if self._record + unfinished > self._max:
            raise RecordTooLarge
