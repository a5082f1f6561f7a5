"""What a sans-I/O session of the agent channel asks of its connection: send a message, or
close it, and with which code when a message could not be decoded. The agent's session
(``agent.session``) and the hub's (``app.hub.session``) both answer every input with a list
of outputs; these mean the same on either side, so they are defined once here, and each
side adds the output only it has (the agent executes a command, the hub observes a report).
"""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

from wire.errors import MessageTooLarge, ProtocolError
from wire.messages import CloseCode

MessageT = TypeVar("MessageT", covariant=True)


class Send(msgspec.Struct, Generic[MessageT], frozen=True):
    """Send ``message`` to the peer, as one text frame."""

    message: MessageT


class Close(msgspec.Struct, frozen=True):
    """Close the connection; ``reason`` already fits a close frame."""

    code: CloseCode
    reason: str


def close_code_for(error: ProtocolError) -> CloseCode:
    """How either side closes on a message it could not decode: 1009 for one too large,
    1002 for everything else."""
    return (
        CloseCode.MESSAGE_TOO_BIG
        if isinstance(error, MessageTooLarge)
        else CloseCode.PROTOCOL_ERROR
    )
