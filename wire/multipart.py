"""A sans-I/O reader of ``multipart/form-data`` bodies, for uploads that must not be held
whole in memory.

Bytes go in as they arrive, events come out; nothing is kept but a part's header block
(bounded) and the few bytes at the end of a chunk that could be the start of the next
boundary. The gateway reads the form fields before an upload's file with it, to find the
``model`` it routes by, and then passes the body on byte for byte; the engine simulator reads
the whole upload with it, counting the file's bytes as they pass.

    reader = MultipartReader(boundary_of(content_type))
    for event in reader.feed(chunk):
        match event:
            case PartStarted(name=name, filename=filename): ...
            case PartData(data=data): ...
            case PartEnded(): ...
    reader.finish()        # MalformedMultipart if the body ended before its closing boundary

Exceptions::

    MalformedMultipart    the body, or its content type, is not multipart/form-data as
                          RFC 7578 writes it (or a part's headers exceed their bound)
"""

from __future__ import annotations

import re
from enum import Enum, auto

import msgspec

MAX_PART_HEADER_BYTES = 16 * 1024
"""A part's header block: a name, a file name and a content type fit in far less."""
MAX_BOUNDARY_CHARS = 70
"""RFC 2046's limit."""

_BOUNDARY = re.compile(r'(?:^|;)\s*boundary\s*=\s*(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_DISPOSITION_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))')
_CRLF = b"\r\n"


class MalformedMultipart(Exception):
    """The body, or its content type, is not readable multipart/form-data."""


class PartStarted(msgspec.Struct, frozen=True):
    """A part begins: its form field ``name``, and ``filename`` for a file (None for a
    plain field)."""

    name: str
    filename: str | None
    content_type: str | None


class PartData(msgspec.Struct, frozen=True):
    """Some bytes of the current part's content, in order."""

    data: bytes


class PartEnded(msgspec.Struct, frozen=True):
    """The current part is over."""


class BodyEnded(msgspec.Struct, frozen=True):
    """The closing boundary was read: the form is complete."""


Event = PartStarted | PartData | PartEnded | BodyEnded


def boundary_of(content_type: str) -> bytes:
    """The boundary of a ``multipart/form-data`` content type; ``MalformedMultipart`` when
    it is another type or has no usable boundary."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != "multipart/form-data":
        raise MalformedMultipart(
            f"the content type must be multipart/form-data, not {media_type or 'none'}"
        )
    found = _BOUNDARY.search(content_type[len(content_type.split(";", 1)[0]) :])
    if found is None:
        raise MalformedMultipart("the multipart/form-data content type names no boundary")
    boundary = found[1] or found[2]
    if len(boundary) > MAX_BOUNDARY_CHARS:
        raise MalformedMultipart(f"the boundary is longer than {MAX_BOUNDARY_CHARS} characters")
    try:
        return boundary.encode("ascii")
    except UnicodeEncodeError:
        raise MalformedMultipart("the boundary is not ASCII") from None


class _State(Enum):
    PREAMBLE = auto()
    AFTER_BOUNDARY = auto()
    HEADERS = auto()
    CONTENT = auto()
    EPILOGUE = auto()


class MultipartReader:
    """Reads one multipart body; ``feed`` it the bytes as they come."""

    def __init__(self, boundary: bytes) -> None:
        if not boundary:
            raise MalformedMultipart("the boundary is empty")
        # The first boundary may open the body; every other one follows a line break.
        # Reading the body as if it began with one makes every boundary look alike.
        self._delimiter = _CRLF + b"--" + boundary
        self._buffer = bytearray(_CRLF)
        self._state = _State.PREAMBLE

    @property
    def complete(self) -> bool:
        """Whether the closing boundary was read."""
        return self._state is _State.EPILOGUE

    def feed(self, data: bytes) -> list[Event]:
        """The events ``data`` completes (it may complete none)."""
        if self._state is _State.EPILOGUE:
            return []  # what follows the closing boundary means nothing
        self._buffer += data
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> None:
        """The body ended: ``MalformedMultipart`` unless its closing boundary was read."""
        if self._state is not _State.EPILOGUE:
            raise MalformedMultipart("the body ends before its closing boundary")

    def _step(self, events: list[Event]) -> bool:
        """Read what the buffer holds for the current state; whether to read on."""
        buffer = self._buffer
        delimiter = self._delimiter
        if self._state is _State.PREAMBLE:
            at = buffer.find(delimiter)
            if at < 0:
                # Keep only what could be the start of the first boundary.
                del buffer[: max(0, len(buffer) - len(delimiter) + 1)]
                return False
            del buffer[: at + len(delimiter)]
            self._state = _State.AFTER_BOUNDARY
            return True
        if self._state is _State.AFTER_BOUNDARY:
            if len(buffer) < 2:
                return False
            if buffer[:2] == b"--":
                self._state = _State.EPILOGUE
                buffer.clear()
                events.append(BodyEnded())
                return False
            end = buffer.find(_CRLF)
            if end < 0:
                if len(buffer) > MAX_BOUNDARY_CHARS:
                    raise MalformedMultipart("a boundary line does not end")
                return False
            if buffer[:end].strip(b" \t"):
                raise MalformedMultipart("a boundary is followed by other text on its line")
            del buffer[: end + 2]
            self._state = _State.HEADERS
            return True
        if self._state is _State.HEADERS:
            if buffer[:2] == _CRLF:
                raise MalformedMultipart("a part has no Content-Disposition with a name")
            end = buffer.find(b"\r\n\r\n")
            if end < 0 or end > MAX_PART_HEADER_BYTES:
                if len(buffer) > MAX_PART_HEADER_BYTES:
                    raise MalformedMultipart(
                        f"a part's headers exceed {MAX_PART_HEADER_BYTES} bytes"
                    )
                return False
            head = bytes(buffer[:end])
            del buffer[: end + 4]
            events.append(_part_started(head))
            self._state = _State.CONTENT
            return True
        if self._state is _State.CONTENT:
            at = buffer.find(delimiter)
            if at < 0:
                keep = len(delimiter) - 1
                if len(buffer) > keep:
                    events.append(PartData(bytes(buffer[: len(buffer) - keep])))
                    del buffer[: len(buffer) - keep]
                return False
            if at:
                events.append(PartData(bytes(buffer[:at])))
            del buffer[: at + len(delimiter)]
            events.append(PartEnded())
            self._state = _State.AFTER_BOUNDARY
            return True
        return False


def _part_started(head: bytes) -> PartStarted:
    name = filename = content_type = None
    for line in head.split(_CRLF):
        field, colon, value = line.decode("utf-8", errors="replace").partition(":")
        if not colon:
            raise MalformedMultipart(f"a part's header line has no colon: {line[:80]!r}")
        field = field.strip().lower()
        if field == "content-disposition":
            kind, _, params = value.strip().partition(";")
            if kind.strip().lower() != "form-data":
                raise MalformedMultipart("a part's Content-Disposition is not form-data")
            for found in _DISPOSITION_PARAM.finditer(";" + params):
                key = found[1].lower()
                text = found[2] if found[2] is not None else found[3]
                text = re.sub(r"\\(.)", r"\1", text)
                if key == "name":
                    name = text
                elif key == "filename":
                    filename = text
        elif field == "content-type":
            content_type = value.strip()
    if name is None:
        raise MalformedMultipart("a part has no Content-Disposition with a name")
    return PartStarted(name, filename, content_type)
