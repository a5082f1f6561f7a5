"""One request passed to an engine (``CompletionExchange``): what it asked, where it went,
how it ended, and the gateway's headers of its answer (``x-request-id``,
``x-llmgw-gateway-ms``, the key's rate-limit headers and, when asked for, ``x-llmgw-route``).
"""

from __future__ import annotations

from app.gateway.affinity import RouteKey
from app.gateway.asgi import Header, clock, request_id
from app.gateway.lease import Lease
from app.gateway.proxy import Timing
from app.gateway.table import KeyRecord

ROUTE_HEADER = b"x-llmgw-route"
"""Asked for with any value but ``0``, answered with the routing decision (``route_header``)."""


class CompletionExchange:
    """One completion request: what it asked, where it went, and what its log line says."""

    __slots__ = (
        "added_s",
        "body",
        "ended_at",
        "first_byte_at",
        "key",
        "log_level",
        "model",
        "note",
        "quota_headers",
        "replica",
        "request_id",
        "reserved_tokens",
        "route_header",
        "route_key",
        "status",
        "stream",
        "timing",
        "token_estimate",
    )

    def __init__(self, started: float) -> None:
        self.timing = Timing(started)
        self.request_id = request_id()
        self.key: KeyRecord | None = None
        self.body = b""
        self.model = ""
        self.stream = False
        self.replica = ""
        self.route_key: RouteKey | None = None
        self.route_header: bytes | None = None
        """``x-llmgw-route`` of the answer, once a replica took it; ``None`` unless the
        client asked for it."""
        self.status = 500
        self.note: str | None = None
        self.log_level: int | None = None
        """The level of the request's line where its status alone would mislead (a 503
        that autoscaling or a stopping gateway means: ``ExchangeSteps.refused``,
        ``ServedRoute``); None: by its status."""
        self.quota_headers: tuple[Header, ...] = ()
        self.token_estimate = 1
        """What a tpm limit reserves at admission: prompt and the most it may generate."""
        self.reserved_tokens = 0
        self.first_byte_at: float | None = None
        self.ended_at: float | None = None
        """When the engine's answer was all read (a stream's last chunk relayed)."""
        self.added_s: float | None = None
        """Fixed when the answer starts; until then, ``timing`` says."""

    @property
    def answer_started(self) -> bool:
        return self.added_s is not None

    def answer_headers(self) -> list[Header]:
        """The gateway's headers of an answer that starts now."""
        self.added_s = self.timing.added_s(clock())
        return [
            (b"x-request-id", self.request_id),
            (b"x-llmgw-gateway-ms", b"%.3f" % (self.added_s * 1000)),
            *self.quota_headers,
            *(() if self.route_header is None else ((ROUTE_HEADER, self.route_header),)),
        ]


def route_header(lease: Lease, key: RouteKey | None) -> bytes:
    """``replica=<id>; policy=<policy>; reason=<reason>; key=<prefix|session|none>``."""
    return (
        f"replica={lease.route.replica_id}; policy={lease.policy}; reason={lease.reason}; "
        f"key={'none' if key is None else key.kind}"
    ).encode()
