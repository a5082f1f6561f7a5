"""Errors of the agent channel, shared by the control plane and the agent.

::

    FleetError
    ├── ProtocolError               the peer broke the protocol; that connection is closed
    │   ├── MessageTooLarge         over MAX_MESSAGE_BYTES (close 1009)
    │   ├── MalformedMessage        not JSON, not an object, wrong field types, nested too
    │   │                           deeply (close 1002)
    │   ├── UnknownMessageType      a type this side does not receive (close 1002)
    │   └── UnsupportedVersion      a hello or welcome in a version we do not speak (close 1002)
    └── SessionStateError           a session method called in a state that does not allow it

A ``ProtocolError`` is about bytes that came off the wire; the sessions turn it into a
``Close`` output and never let it escape. A ``SessionStateError`` is a bug or a race in
the caller (sending a command to a connection that has not said hello, say) and is raised.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every agent-channel error."""


class ProtocolError(FleetError):
    """The peer sent something the protocol does not allow."""


class MessageTooLarge(ProtocolError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message of {size} bytes is over the {limit}-byte limit")
        self.size = size
        self.limit = limit


class MalformedMessage(ProtocolError):
    """Not JSON, not a JSON object, or a field of the wrong type (the text names its path)."""


class UnknownMessageType(ProtocolError):
    def __init__(self, message_type: str, reason: str) -> None:
        super().__init__(reason)
        self.message_type = message_type


class UnsupportedVersion(ProtocolError):
    def __init__(self, offered: int, supported: int) -> None:
        super().__init__(
            f"protocol version {offered} is not supported; this side speaks version {supported}"
        )
        self.offered = offered
        self.supported = supported


class SessionStateError(FleetError):
    """A session was asked to do something its current state does not allow."""
