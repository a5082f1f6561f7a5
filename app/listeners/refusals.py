"""What a listener refuses by itself, before any app sees a request: counted for
``/metrics`` and logged, without letting a flood of refusals flood the log; and the
connections it closes because they never sent a byte, counted and not logged.

Each refusal is one of a small fixed set of reasons (``RefusalReason``): the metric's
``reason`` label takes no other value, whoever connects, so a hostile client opening
thousands of connections adds to a count, never a series. Counting is an integer add on
the refusal's own path; an accepted connection costs nothing more.

The log says each reason at most once a ``LOG_INTERVAL_S``, with how many refusals of that
reason went unlogged since its last line (``refused_unlogged``): the first refusal after a
quiet minute is logged at once, the rest of a burst is in the count and in the next line
(``app.domain.log_throttle``, as every throttled warning).
Each line is a warning: something refused and handled (docs/operations.md, Logs).

A connection that begins no request before its header timeout is no refusal: load
balancers and proxies open connections ahead of use and TCP health checks connect and say
nothing, so a silent connection is healthy traffic; so is one that sent only empty lines,
which some clients and load balancers send between requests or as a keep-alive probe and
which begin no request (RFC 9112, 2.2). It is closed without an answer (no request was
asked) and only counted (``closed_silent``), so that an alert on refusals fires on clients
that began a request and stalled, never on a pool of idle connections.

A kept-alive connection closed at the listener's idle time between requests is counted too
(``closed_keepalive``), apart from the silent ones: it served requests, and its count says
how often clients keep connections open longer than the listener does, each such close a
chance for a client's next request to race it; mixed with the pool of connections opened
ahead of use, that would be lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from enum import StrEnum

import structlog
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from app.domain.log_throttle import LogThrottle

LOG_INTERVAL_S = 60.0
RETRY_AFTER_S = 1.0
"""``Retry-After`` of the 503 at the connection limit: a connection frees up as soon as
any request ends, as with the gateway's other 503s."""
log = structlog.get_logger(__name__)


class RefusalReason(StrEnum):
    CONNECTIONS = "connections"
    """503: the listener holds ``max_connections`` connections already."""
    HEADER_TIMEOUT = "header_timeout"
    """408: the head, begun, did not arrive whole within ``header_timeout_s``; a connection
    that sent nothing, or empty lines only, is no refusal
    (``ListenerRefusals.closed_silent``)."""
    BODY_TIMEOUT = "body_timeout"
    """408: the body did not arrive within ``body_timeout_s``."""
    HEADER_SIZE = "header_size"
    """431: a head over ``max_header_bytes``."""
    BODY_SIZE = "body_size"
    """413: a body announced over ``max_body_bytes``."""
    MALFORMED = "malformed"
    """400: a request HTTP cannot parse."""
    FRAMING = "framing"
    """400 or 505: a head a proxy in front could frame otherwise (``http11.framing_refusal``)."""


class ListenerRefusals:
    """The refusals of one listener since it was made, and the silent and the kept-alive
    idle connections it closed. ``name``: the listener, as its log lines and its metrics'
    ``listener`` label all call it, so that a line is found from the series it explains.
    ``clock``: monotonic seconds."""

    def __init__(
        self,
        name: str,
        *,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._clock = clock
        self._totals = dict.fromkeys(RefusalReason, 0)
        self._silent_closed = 0
        self._keepalive_closed = 0
        self._lines = LogThrottle(interval_s, max_keys=len(RefusalReason))
        """Every reason remembered: the reasons are few and fixed, whoever connects."""

    def totals(self) -> dict[RefusalReason, int]:
        """Refusals by reason, every reason present."""
        return dict(self._totals)

    @property
    def silent_closed(self) -> int:
        """Connections closed for beginning no request within the header timeout."""
        return self._silent_closed

    @property
    def keepalive_closed(self) -> int:
        """Kept-alive connections closed for beginning no next request within the idle
        time between requests."""
        return self._keepalive_closed

    def closed_silent(self) -> None:
        """Count a connection closed, unanswered, for beginning no request within the
        header timeout (it sent nothing, or empty lines only): a preconnected or
        health-checking peer, not a refusal, so not logged (a pool of such connections
        would be a line each)."""
        self._silent_closed += 1

    def closed_keepalive(self) -> None:
        """Count a kept-alive connection closed, unanswered, for beginning no next request
        within the idle time between requests: no refusal, so not logged."""
        self._keepalive_closed += 1

    def refused(
        self,
        reason: RefusalReason,
        status: int,
        client: tuple[str, int] | None,
        limit: float | None = None,
    ) -> None:
        """Count a refusal, and log it unless its reason was logged within the interval.
        ``limit``: the listener's limit the client ran into (seconds, bytes, connections),
        where one did."""
        self._totals[reason] += 1
        unlogged = self._lines.admit(reason, self._clock())
        if unlogged is None:
            return
        log.warning(
            "listener_refused",
            listener=self.name,
            reason=reason.value,
            status=status,
            client=client[0] if client else None,
            limit=limit,
            refused_unlogged=unlogged,
        )


class ListenerCollector(Collector):
    """Three counters of each of ``listeners``, by ``listener`` (its ``name``, as its log
    lines say), read at each scrape: ``{prefix}_refusals`` by reason,
    ``{prefix}_idle_closed``, the connections closed for beginning no request, and
    ``{prefix}_keepalive_closed``, the kept-alive ones closed for beginning no next one.
    Each listener has every series from the start."""

    def __init__(self, prefix: str, listeners: Sequence[ListenerRefusals]) -> None:
        self._prefix = prefix
        self._listeners = listeners

    def collect(self) -> Iterator[Metric]:
        refusals = CounterMetricFamily(
            f"{self._prefix}_refusals",
            "Connections and requests the listener refused itself, before any request "
            "reached the app, by listener and reason: connections (503 at max connections), "
            "header_timeout and body_timeout (408), header_size (431), body_size (413), "
            "malformed (400), framing (400 or 505).",
            labels=["listener", "reason"],
        )
        idle_closed = CounterMetricFamily(
            f"{self._prefix}_idle_closed",
            "Connections the listener closed without an answer because they began no "
            "request within the header timeout: sent no byte, or empty lines only "
            "(preconnected by a load balancer or proxy, or a TCP health check), by listener; "
            "not refusals.",
            labels=["listener"],
        )
        keepalive_closed = CounterMetricFamily(
            f"{self._prefix}_keepalive_closed",
            "Kept-alive connections the listener closed without an answer because they "
            "began no next request within its idle time between requests, by listener; "
            "not refusals.",
            labels=["listener"],
        )
        for listener in self._listeners:
            for reason, total in listener.totals().items():
                refusals.add_metric([listener.name, reason.value], total)
            idle_closed.add_metric([listener.name], listener.silent_closed)
            keepalive_closed.add_metric([listener.name], listener.keepalive_closed)
        yield refusals
        yield idle_closed
        yield keepalive_closed
