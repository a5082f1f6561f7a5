"""Why the router gives a request no replica: a refusal, which the gateway answers with
its own error (``app.gateway.exchange_steps``).

    RouteRefused            the request gets no replica
    ├── NoServingReplica    no route for the model: 503 (its operator scaled it to zero,
    │   │                   or its replicas are starting: 503 that says so)
    │   └── ModelRemoved    a request waited for a model that is no longer declared: 404
    ├── FailingToStart      no route, and the model is in failure backoff with no replica
    │                       starting (at once, or released from a hold): 503 with
    │                       ``Retry-After`` the time until the next attempt
    ├── Saturated           every replica at its limit, or the queue full: 429 with
    │                       ``Retry-After``
    ├── GatewayStopping     held for a model starting from zero as the gateway stops: 503
    └── ColdStartTimedOut   held for a model starting from zero, and no replica came within
                            its cold-start timeout: 503 with ``Retry-After``
"""

from __future__ import annotations

import math

COLD_START_RETRY_AFTER_S = (1.0, 30.0)
"""What ``ColdStartTimedOut`` tells clients: a tenth of the cold-start timeout, within
these bounds. The replica may be about to serve, or may take as long again."""


class RouteRefused(Exception):
    """The request gets no replica: the caller answers it with the subclass's error."""


class NoServingReplica(RouteRefused):
    def __init__(self, model: str, *, scaled_to_zero: bool = False, starting: int = 0) -> None:
        """``scaled_to_zero``: its operator scaled it to 0 replicas (it has no autoscaling
        policy), so none comes back until an operator scales it up. ``starting``: how many
        of its replicas are placed or starting (loading their weights), so one may serve
        within seconds."""
        super().__init__(f"no serving replica for model {model!r}")
        self.model = model
        self.scaled_to_zero = scaled_to_zero
        self.starting = starting


class ModelRemoved(NoServingReplica):
    """The model of a request that was waiting (held for a cold start, or for room) is no
    longer declared: it will not be served here, now or on a retry."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.args = (f"model {model!r} is no longer declared",)


class FailingToStart(RouteRefused):
    def __init__(self, model: str, failures: int, retry_after_s: float) -> None:
        """``model`` has ``failures`` in a row (``Model.failures``: replicas that failed
        or timed out as they started, or crashed soon after serving) and the next is
        placed in ``retry_after_s``."""
        super().__init__(
            f"model {model!r} is failing to start ({failures} in a row); "
            f"retry after {retry_after_s:g} s"
        )
        self.model = model
        self.failures = failures
        self.retry_after_s = retry_after_s


class Saturated(RouteRefused):
    def __init__(self, retry_after_s: float, *, starting: bool = False) -> None:
        """``starting``: the model has no replica yet, and the queue is full."""
        super().__init__(f"every replica is saturated; retry after {retry_after_s:g} s")
        self.retry_after_s = retry_after_s
        self.starting = starting


class GatewayStopping(RouteRefused):
    def __init__(self, model: str) -> None:
        """A request held for ``model``'s cold start, turned away as the gateway stops: no
        replica can serve it here any more, another gateway may."""
        super().__init__(f"the gateway is stopping; model {model!r} is still starting")
        self.model = model


class ColdStartTimedOut(RouteRefused):
    def __init__(self, model: str, timeout_s: float, retry_after_s: float) -> None:
        super().__init__(
            f"model {model!r} is starting from zero and no replica served within "
            f"{timeout_s:g} s; retry after {retry_after_s:g} s"
        )
        self.model = model
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s


def backoff_retry_after_s(retry_at: float, now: float) -> float:
    """What ``FailingToStart`` tells clients: the whole seconds until the next attempt, at
    least one."""
    return float(max(1, math.ceil(retry_at - now)))


def cold_start_retry_after_s(timeout_s: float) -> float:
    low, high = COLD_START_RETRY_AFTER_S
    return float(min(high, max(low, math.ceil(timeout_s / 10))))
