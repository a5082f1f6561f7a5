"""Reading a ``text/event-stream`` line by line, as the HTML standard interprets one: no
socket here, lines in and messages out."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SseMessage:
    data: str
    id: str | None
    """The stream's last event id when this message was dispatched."""
    event: str = "message"


@dataclass
class SseParser:
    last_id: str | None = None
    _data: list[str] = field(default_factory=list)
    _event: str = ""

    def feed(self, line: str) -> SseMessage | None:
        """One line without its line break; the message a blank line completes, if any."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_id = value
        return None

    def _dispatch(self) -> SseMessage | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SseMessage(data="\n".join(data), id=self.last_id, event=event or "message")
