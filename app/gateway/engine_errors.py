"""What the engine client (``app.gateway.engine_client``) raises when an engine fails a
request, or sends what the gateway does not take (``app.gateway.engine_bounds``)::

    EngineUnreachable   no answer head: connecting failed, or the connection dropped first
    └── HeadRefused     a head the gateway does not relay: too large, 101, an odd status,
                        not HTTP
    HeadTimedOut        no answer head within ``head_s`` (or an upload unread for ``idle_s``)
    AnswerBroken        the connection dropped, or sent garbage, in the middle of an answer
    ├── AnswerTooLarge  an answer read whole is over ``MAX_ANSWER_BYTES``
    └── AnswerStalled   the engine sent nothing more of its answer within its bound
"""

from __future__ import annotations


class EngineUnreachable(Exception):
    """No answer head: connecting failed, or the connection dropped first."""


class HeadRefused(EngineUnreachable):
    """The engine's answer head is one the gateway does not relay (its connection is
    closed): over ``MAX_HEAD_BYTES``, 101 Switching Protocols, a status outside 100..599,
    or one that is not HTTP httptools reads one way."""


class HeadTimedOut(Exception):
    """No answer head within the head bound (the connection is closed). Not an
    ``EngineUnreachable``: the engine has the request, and may have worked on it, so it is
    not sent again."""

    def __init__(self, timeout_s: float, message: str | None = None, bound: str = "head") -> None:
        super().__init__(message or f"the engine did not answer within {timeout_s:g} s")
        self.timeout_s = timeout_s
        self.bound = bound
        """``"head"``, or ``"idle"``: the engine stopped reading an upload's body."""


class AnswerBroken(Exception):
    """The connection dropped, or sent garbage, in the middle of an answer."""


class AnswerTooLarge(AnswerBroken):
    """An answer read whole is over ``MAX_ANSWER_BYTES``, or an error answer over
    ``MAX_ERROR_BYTES`` (its connection is closed)."""


class AnswerStalled(AnswerBroken):
    """The engine sent nothing more of an answer within its bound (the connection is
    closed): its first piece within the head bound, a later one within the idle bound."""

    def __init__(self, message: str, bound: str, timeout_s: float) -> None:
        super().__init__(message)
        self.bound = bound
        """``"head"`` (its first piece) or ``"idle"`` (a later one)."""
        self.timeout_s = timeout_s
