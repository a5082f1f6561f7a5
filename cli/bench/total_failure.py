"""When a level has plainly failed whole: every client saw its requests fail, none succeeded.

An engine that refuses every request (a prompt longer than its context, a model it cannot
serve) answers at once, so a closed loop would send it tens of thousands of requests in
one level before the climb learned what the first answer said. ``TotalFailure`` says when
to stop instead: no request of the level has succeeded, at least ``MIN_FAILURES`` have
failed, and every client has seen one of its own fail, so a slow request that might still
succeed keeps the level going. A level stopped so breaks the SLO whatever else it
measured: no latency can be read from it.
"""

from __future__ import annotations

MIN_FAILURES = 20
"""Enough that a brief refusal (an engine swapping its batch) does not end a level."""


class TotalFailure:
    def __init__(self, clients: int, *, min_failures: int = MIN_FAILURES) -> None:
        if clients < 1:
            raise ValueError("a level has at least one client")
        self._clients_without_failure = set(range(clients))
        self._min_failures = min_failures
        self._failures = 0
        self._succeeded = False

    def failed(self, client: int) -> None:
        self._failures += 1
        self._clients_without_failure.discard(client)

    def succeeded(self) -> None:
        self._succeeded = True

    @property
    def nothing_succeeded(self) -> bool:
        return not self._succeeded

    @property
    def certain(self) -> bool:
        """Nothing succeeds: the level can stop, its verdict known."""
        return (
            not self._succeeded
            and self._failures >= self._min_failures
            and not self._clients_without_failure
        )
