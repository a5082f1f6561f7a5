"""``--timeout`` for every command that follows something with ``--wait`` (``rollout
status``, ``drain``, ``drain-progress``, ``drain-cancel``): one flag, one rule.

A script (CI, a deploy job) that waits for a rollout or a drain bounds the wait: with
``--timeout S`` the command stops following after S seconds and exits 1, saying that the
time ran out and that what it followed goes on (the server is not asked to stop it). Given
without ``--wait`` it is bad usage (exit 2), before anything is sent: ignored, it would let
a script believe it had set a bound.
"""

from __future__ import annotations

import time
from typing import Annotated

from cyclopts import Parameter

from cli.arguments import NumberWithin, UsageError

WaitTimeout = Annotated[
    float | None,
    Parameter(
        converter=NumberWithin(0, above_low=True),
        help="With --wait, give up following after this many seconds (exit 1, saying so; "
        "what it follows goes on). [default: no limit]",
    ),
]


def check_wait_timeout(timeout_s: float | None, wait: bool) -> None:
    """A ``UsageError`` for a ``--timeout`` without ``--wait``."""
    if timeout_s is not None and not wait:
        raise UsageError("--timeout bounds --wait: give --wait too, or leave --timeout out")


class Deadline:
    """When a wait of at most ``timeout_s`` seconds (None: no bound) started now ends."""

    def __init__(self, timeout_s: float | None) -> None:
        self._ends = None if timeout_s is None else time.monotonic() + timeout_s

    def passed(self) -> bool:
        return self._ends is not None and time.monotonic() >= self._ends

    def left_s(self, at_most: float) -> float:
        """How long to sleep before looking again: ``at_most``, or what is left if less."""
        if self._ends is None:
            return at_most
        return max(0.0, min(at_most, self._ends - time.monotonic()))
